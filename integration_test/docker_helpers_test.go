package integration_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The Docker tests (the Dockerfile, docker-compose.yml) drive the docker
// and compose command-line tools as a user would. They need a Docker
// engine and fail — never skip — without one. Images come from the
// variables docker-compose.yml and the Dockerfile read (defaults: the
// upstream images); docker/build-images.sh builds local stand-ins and
// prints the values where no registry can be reached.

// repoRoot is the repository's top directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// run runs a command in dir with extra environment variables and returns
// its combined output; it fails t, with the output, when the command fails.
func run(t *testing.T, ctx context.Context, dir string, env []string, name string, args ...string) string {
	t.Helper()
	out, err := tryRun(ctx, dir, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

// tryRun is run that returns the error instead.
func tryRun(ctx context.Context, dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// needDocker fails t unless the docker command and an engine answer.
func needDocker(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		t.Fatalf("the Docker tests need the docker command and a Docker engine: %v (apt-get install -y docker.io)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := tryRun(ctx, "", nil, "docker", "version", "--format", "{{.Server.Version}}"); err != nil {
		t.Fatalf("the Docker tests need a Docker engine: docker version: %v\n%s", err, out)
	}
}

// composeCommand is the compose tool: the docker compose plugin, else the
// standalone docker-compose.
func composeCommand(t *testing.T) []string {
	t.Helper()
	needDocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := tryRun(ctx, "", nil, "docker", "compose", "version"); err == nil {
		return []string{"docker", "compose"}
	}
	if _, err := exec.LookPath("docker-compose"); err == nil {
		return []string{"docker-compose"}
	}
	t.Fatal("the compose tests need docker compose or docker-compose (apt-get install -y docker-compose)")
	return nil
}

// buildPgfenceImage builds the repository's Dockerfile into a new tag that
// is removed when t ends, and returns the tag. The build stage's and final
// stage's base images come from PGFENCE_GO_IMAGE and PGFENCE_RUNTIME_IMAGE
// (defaults: the Dockerfile's). Modules come from this host's module cache
// through a proxy on loopback (the build runs with --network host), so the
// build needs no network of its own; the layer cache makes a second build
// quick, and the next run's too when the sources have not changed.
func buildPgfenceImage(t *testing.T) string {
	t.Helper()
	needDocker(t)
	root := repoRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	defer lockBuilds(t, ctx)()
	downloadBuildModules(t, ctx, root)
	modcache := strings.TrimSpace(run(t, ctx, root, nil, "go", "env", "GOMODCACHE"))
	proxy := httptest.NewUnstartedServer(http.FileServer(http.Dir(filepath.Join(modcache, "cache", "download"))))
	// A fixed port when free: GOPROXY is a build argument, and a new value
	// would invalidate the layer cache of every later build step.
	if ln, err := net.Listen("tcp", "127.0.0.1:17473"); err == nil {
		proxy.Listener.Close()
		proxy.Listener = ln
	}
	proxy.Start()
	defer proxy.Close()

	tag := "pgfence-test/pgfence:" + randomSuffix()
	args := []string{"build", "--network", "host", "--build-arg", "GOPROXY=" + proxy.URL}
	if v := os.Getenv("PGFENCE_GO_IMAGE"); v != "" {
		args = append(args, "--build-arg", "GO_IMAGE="+v)
	}
	if v := os.Getenv("PGFENCE_RUNTIME_IMAGE"); v != "" {
		args = append(args, "--build-arg", "RUNTIME_IMAGE="+v)
	}
	start := time.Now()
	// The build stage first, under this process's tag (see buildStageTag),
	// then the image, from the build stage's cache.
	run(t, ctx, root, nil, "docker", append(args, "--target", "build", "-t", buildStageTag, ".")...)
	run(t, ctx, root, nil, "docker", append(args, "-t", tag, ".")...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if out, err := tryRun(ctx, "", nil, "docker", "rmi", tag); err != nil {
			t.Errorf("docker rmi %s: %v\n%s", tag, err, out)
		}
	})
	t.Logf("built %s from the Dockerfile in %v", tag, time.Since(start).Round(time.Second))
	pruneBuildStages.Do(func() { pruneOlderBuildStages(t, ctx) })
	return tag
}

// buildStageTag names the Dockerfile's build stage as this test process
// built it. The classic builder keeps a multi-stage build's earlier
// stages as untagged images (its layer cache): half a gigabyte per run,
// which no one could tell from other untagged images. Tagged, the
// latest run's stays as the next run's cache and older ones are removed
// (pruneOlderBuildStages).
var buildStageTag = buildStageRepo + ":" + randomSuffix()

const buildStageRepo = "pgfence-test/build-stage"

var pruneBuildStages sync.Once

// lockBuilds takes a lock file shared by every build on this machine,
// and returns its release: one build at a time. Two would share the work
// anyway, through the layer cache, but race to fill it on two cores; and
// another test process's build would find the proxy's fixed port taken (a
// new GOPROXY value, so no layer cache), and its pruning could remove the
// build stage this build is about to use. Each call opens the file anew,
// so the lock excludes this process's other builds too.
func lockBuilds(t *testing.T, ctx context.Context) (unlock func()) {
	t.Helper()
	name := filepath.Join(os.TempDir(), "pgfence-test-docker-build.lock")
	// Read-only, and created only if missing: another user's lock file
	// in a sticky directory can be opened so, not written or re-created.
	f, err := os.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = os.OpenFile(name, os.O_CREATE|os.O_RDONLY, 0o666)
	}
	if err != nil {
		t.Fatalf("lock the Docker builds: %v", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = f.Close() } // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			t.Fatalf("lock %s: %v", name, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			t.Fatalf("lock %s: another test process still held it when the build's time ran out (%v)", name, ctx.Err())
		case <-time.After(100 * time.Millisecond): // polling: flock has no wait with a deadline
		}
	}
}

// pruneOlderBuildStages removes the build-stage tags of earlier test
// processes, and with them the layers no other image uses. A removal that
// fails (another process's build still using it) is logged, not fatal:
// the layers are a cache.
func pruneOlderBuildStages(t *testing.T, ctx context.Context) {
	t.Helper()
	out := run(t, ctx, "", nil, "docker", "images", "--filter", "reference="+buildStageRepo, "--format", "{{.Repository}}:{{.Tag}}")
	for _, ref := range strings.Fields(out) {
		if ref == buildStageTag {
			continue
		}
		if out, err := tryRun(ctx, "", nil, "docker", "rmi", ref); err != nil {
			t.Logf("docker rmi %s (an earlier run's build stage): %v\n%s", ref, err, out)
		}
	}
}

// downloadBuildModules fills this host's module cache with what the
// Dockerfile's build stage asks the proxy for. That is not the workspace's
// build list: the image builds the library alone (go mod download), then
// the library and the command as a workspace of two, and go.work's other
// modules raise some versions above what those two require.
func downloadBuildModules(t *testing.T, ctx context.Context, root string) {
	t.Helper()
	run(t, ctx, root, []string{"GOWORK=off"}, "go", "mod", "download")
	work := filepath.Join(t.TempDir(), "go.work")
	env := []string{"GOWORK=" + work}
	run(t, ctx, root, env, "go", "work", "init", root, filepath.Join(root, "cmd", "pgfence"))
	run(t, ctx, root, env, "go", "work", "edit", "-replace", "github.com/pgfence/pgfence@v0.0.0-00010101000000-000000000000="+root)
	run(t, ctx, root, env, "go", "mod", "download")
}

// randomSuffix is a short random lower-case hex string, for names that
// must not collide with another test's or another run's.
func randomSuffix() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	return hex.EncodeToString(b)
}
