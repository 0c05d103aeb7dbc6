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

// go install …/cmd/pgfence@latest works from the modules as a proxy serves
// them (no replace directives; the migrations travel in the library's zip;
// the command's module requires the library at the same version), and the
// binary reports the version it was installed at. The proxy is a directory
// holding this checkout's two modules as a made-up prerelease, in front of
// the local module cache's download directory (itself laid out as a
// proxy), so the install fetches nothing from the network; the test fills
// that cache first (fillModuleCache).
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
	cmdDir := filepath.Dir(goEnv("GOMOD")) // this module: cmd/pgfence
	root := filepath.Join(cmdDir, "..", "..")
	fillModuleCache(t, goBin, root, cmdDir)
	version := fmt.Sprintf("v0.0.1-installtest.%d", time.Now().UnixNano())
	proxy := t.TempDir()
	env := append(os.Environ(),
		"GOPROXY=file://"+proxy+",file://"+filepath.Join(goEnv("GOMODCACHE"), "cache", "download"),
		"GOMODCACHE="+t.TempDir(), // the made-up version stays out of the real cache
		// The made-up version is in no checksum database; the dependencies
		// come from the local cache, verified when they were downloaded,
		// and are checked against the modules' go.sum.
		"GOSUMDB=off",
		"GOFLAGS=-modcacherw", // so that the test can remove its module cache
		"GOTOOLCHAIN=local",
		"GOWORK=off",
	)
	// The library first; then the command, whose go.mod requires the
	// library at this version and whose go.sum gets the library's sums.
	libFiles := moduleFiles(t, gitBin, root, "cmd/pgfence/", "integration_test/", "pgfencetest/", "go.work")
	publish(t, root, libFiles, filepath.Join(proxy, modulePath, "@v"), modulePath, version, nil)
	download := exec.Command(goBin, "mod", "download", "-json", modulePath+"@"+version)
	download.Dir = t.TempDir()
	download.Env = env
	out, err := download.Output()
	if err != nil {
		t.Fatalf("go mod download %s@%s: %v", modulePath, version, err)
	}
	var sums struct{ Sum, GoModSum string }
	if err := json.Unmarshal(out, &sums); err != nil {
		t.Fatal(err)
	}
	cmdPath := modulePath + "/cmd/pgfence"
	publish(t, cmdDir, moduleFiles(t, gitBin, cmdDir), filepath.Join(proxy, cmdPath, "@v"), cmdPath, version, map[string]func([]byte) []byte{
		"go.mod": func(b []byte) []byte {
			return []byte(strings.Replace(string(b), modulePath+" v0.0.0-00010101000000-000000000000", modulePath+" "+version, 1))
		},
		"go.sum": func(b []byte) []byte {
			return append(b, []byte(fmt.Sprintf("%s %s %s\n%s %s/go.mod %s\n", modulePath, version, sums.Sum, modulePath, version, sums.GoModSum))...)
		},
	})

	bin := t.TempDir()
	cmd := exec.Command(goBin, "install", "-trimpath", cmdPath+"@latest")
	cmd.Dir = t.TempDir() // outside any module
	cmd.Env = append(env, "GOBIN="+bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go install %s@latest: %v\n%s", cmdPath, err, out)
	}
	out, err = exec.Command(filepath.Join(bin, "pgfence"), "version").Output()
	if err != nil {
		t.Fatalf("the installed pgfence version: %v", err)
	}
	if !strings.HasPrefix(string(out), "pgfence "+version+"\n") {
		t.Errorf("the installed pgfence says %q, want %q first", out, "pgfence "+version)
	}
}

// fillModuleCache downloads into the local module cache the modules that
// installing the command resolves: those the library and the command
// require, without the workspace's other modules, which raise some
// versions. Another package's tests may have left them there, or not.
// integration_test's downloadBuildModules does this, and the library
// alone, for the Dockerfile's build.
func fillModuleCache(t *testing.T, goBin, root, cmdDir string) {
	t.Helper()
	// A workspace of the two, which takes the library from root, not as
	// the placeholder version the command's go.mod names.
	work := filepath.Join(t.TempDir(), "go.work")
	for _, args := range [][]string{
		{"work", "init", root, cmdDir},
		{"work", "edit", "-replace", modulePath + "@v0.0.0-00010101000000-000000000000=" + root},
		{"mod", "download"},
	} {
		c := exec.Command(goBin, args...)
		c.Dir = root
		c.Env = append(os.Environ(), "GOWORK="+work, "GOTOOLCHAIN=local")
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// moduleFiles lists the module's files at dir as git sees them (tracked and
// untracked but not ignored), leaving out paths with any of the prefixes.
func moduleFiles(t *testing.T, gitBin, dir string, exclude ...string) []string {
	t.Helper()
	ls := exec.Command(gitBin, "ls-files", "--cached", "--others", "--exclude-standard", "-z")
	ls.Dir = dir
	out, err := ls.Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	var files []string
next:
	for name := range strings.SplitSeq(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		for _, p := range exclude {
			if strings.HasPrefix(name, p) {
				continue next
			}
		}
		fi, err := os.Lstat(filepath.Join(dir, name))
		if err != nil || !fi.Mode().IsRegular() {
			continue // deleted in the working tree, or a link: not in a module zip
		}
		files = append(files, name)
	}
	return files
}

// publish writes the files of the module at dir to proxyDir as path@version,
// in the layout of a module proxy (list, .info, .mod, .zip), rewriting the
// files named in edit.
func publish(t *testing.T, dir string, files []string, proxyDir, path, version string, edit map[string]func([]byte) []byte) {
	t.Helper()
	if err := os.MkdirAll(proxyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(proxyDir, version+".zip"))
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	var mod []byte
	for _, name := range files {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if e := edit[name]; e != nil {
			b = e(b)
		}
		if name == "go.mod" {
			mod = b
		}
		w, err := zw.Create(path + "@" + version + "/" + name)
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
	info := fmt.Sprintf(`{"Version":%q,"Time":%q}`, version, time.Now().UTC().Format(time.RFC3339))
	for name, content := range map[string]string{"list": version + "\n", version + ".info": info, version + ".mod": string(mod)} {
		if err := os.WriteFile(filepath.Join(proxyDir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
