package main

import (
	"archive/zip"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgfence/pgfence/migrations"
)

const modulePath = "github.com/pgfence/pgfence"

// version prints the schema version the embedded migrations lead to.
func TestVersion(t *testing.T) {
	t.Parallel()
	schema, err := migrations.Latest()
	if err != nil {
		t.Fatal(err)
	}
	r := cli(t, cliEnv(), "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "pgfence ") || !strings.Contains(r.stdout, fmt.Sprintf("\nschema version %d\n", schema)) {
		t.Errorf("version: exit %d, output %q", r.code, r.stdout)
	}
	r = cli(t, cliEnv(), "version", "--json")
	var v versionInfo
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Version == "" || v.SchemaVersion != schema {
		t.Errorf("version --json: %q (%v)", r.stdout, err)
	}
}

// go install …/cmd/pgfence@latest works from the module as a proxy serves
// it (no replace directives; the migrations travel in the module zip), and
// the binary reports the version it was installed at. The proxy is a
// directory holding this checkout as a made-up prerelease, in front of the
// local module cache's download directory (which is itself laid out as a
// proxy), so nothing is fetched from the network.
func TestGoInstall(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed for this test: %v", err)
	}
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Fatalf("git is needed for this test (it lists the module's files): %v", err)
	}
	goEnv := func(key string) string {
		out, err := exec.Command(goBin, "env", key).Output()
		if err != nil {
			t.Fatalf("go env %s: %v", key, err)
		}
		return strings.TrimSpace(string(out))
	}
	root := filepath.Dir(goEnv("GOMOD"))
	version := fmt.Sprintf("v0.0.1-installtest.%d", time.Now().UnixNano())
	proxy := t.TempDir()
	publish(t, gitBin, root, filepath.Join(proxy, modulePath, "@v"), version)

	bin := t.TempDir()
	cmd := exec.Command(goBin, "install", "-trimpath", modulePath+"/cmd/pgfence@latest")
	cmd.Dir = t.TempDir() // outside any module
	cmd.Env = append(os.Environ(),
		"GOBIN="+bin,
		"GOPROXY=file://"+proxy+",file://"+filepath.Join(goEnv("GOMODCACHE"), "cache", "download"),
		"GOMODCACHE="+t.TempDir(), // the made-up version stays out of the real cache
		// The made-up version is in no checksum database; the dependencies
		// come from the local cache, verified when they were downloaded,
		// and are checked against the module's go.sum.
		"GOSUMDB=off",
		"GOFLAGS=-modcacherw", // so that the test can remove its module cache
		"GOTOOLCHAIN=local",
		"GOWORK=off",
	)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install %s/cmd/pgfence@latest: %v\n%s", modulePath, err, out)
	}
	out, err := exec.Command(filepath.Join(bin, "pgfence"), "version").Output()
	if err != nil {
		t.Fatalf("the installed pgfence version: %v", err)
	}
	if !strings.HasPrefix(string(out), "pgfence "+version+"\n") {
		t.Errorf("the installed pgfence says %q, want %q first", out, "pgfence "+version)
	}
}

// publish writes the module at root, as git sees its files (tracked and
// untracked but not ignored), to dir as version, in the layout of a module
// proxy: list, .info, .mod and .zip.
func publish(t *testing.T, gitBin, root, dir, version string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ls := exec.Command(gitBin, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
	ls.Dir = root
	files, err := ls.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	f, err := os.Create(filepath.Join(dir, version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	for name := range strings.SplitSeq(strings.TrimSuffix(string(files), "\x00"), "\x00") {
		fi, err := os.Lstat(filepath.Join(root, name))
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the working tree, or a link: not in a module zip
		}
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		w, err := zw.Create(modulePath + "@" + version + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	info := fmt.Sprintf(`{"Version":%q,"Time":%q}`, version, time.Now().UTC().Format(time.RFC3339))
	for name, content := range map[string]string{"list": version + "\n", version + ".info": info, version + ".mod": string(mod)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
