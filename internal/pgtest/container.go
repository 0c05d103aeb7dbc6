package pgtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// The container provisioner talks to the Docker Engine API over its Unix
// socket with the standard library alone. testcontainers-go would do the
// same work, but it (and the Docker client under it) would sit in the module
// graph of every program that imports pgfence, since this package's module
// is the library's; the pgfencetest module, which users import into their
// own tests, uses testcontainers-go instead.

// EnvImage names the environment variable that sets the PostgreSQL image
// the container provisioner starts; unset, it is DefaultImage. On a machine
// whose Docker engine reaches no registry, docker/build-images.sh builds a
// stand-in from Debian packages and prints the value to set.
const EnvImage = "PGFENCE_POSTGRES_IMAGE"

// DefaultImage is the upstream PostgreSQL image started when EnvImage is
// unset.
const DefaultImage = "postgres:17-alpine"

// ContainerImage returns the PostgreSQL image for containers: EnvImage's
// value, or DefaultImage.
func ContainerImage() string {
	if img := os.Getenv(EnvImage); img != "" {
		return img
	}
	return DefaultImage
}

// docker is a minimal Docker Engine API client.
type docker struct {
	http *http.Client
	base string
}

// newDocker returns a client for DOCKER_HOST (unix:// or tcp://), by
// default the local engine's socket.
func newDocker() (*docker, error) {
	host := os.Getenv("DOCKER_HOST")
	if host == "" {
		host = "unix:///var/run/docker.sock"
	}
	u, err := url.Parse(host)
	if err != nil {
		return nil, fmt.Errorf("DOCKER_HOST %q: %w", host, err)
	}
	switch u.Scheme {
	case "unix":
		sock := u.Path
		// No keep-alive: an idle connection's goroutines would outlive
		// the test process's last use of the engine (goleak).
		tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}}
		return &docker{http: &http.Client{Transport: tr}, base: "http://docker"}, nil
	case "tcp":
		return &docker{http: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}, base: "http://" + u.Host}, nil
	}
	return nil, fmt.Errorf("DOCKER_HOST %q: want unix:// or tcp://", host)
}

// call sends one request with a JSON body (nil: none) and decodes a JSON
// answer into out (nil: discard). A status of 300 or more is an error with
// the engine's message.
func (d *docker) call(ctx context.Context, method, path string, body, out any) error {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, d.base+path, r)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var msg struct{ Message string }
		_ = json.NewDecoder(resp.Body).Decode(&msg)
		return fmt.Errorf("docker %s %s: %s: %s", method, path, resp.Status, msg.Message)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// DockerAvailable reports whether a Docker engine answers, within ctx.
//
// When the engine runs on this very host (its name is this host's name)
// and TESTCONTAINERS_HOST_OVERRIDE is unset, it sets that variable to
// 127.0.0.1, where Docker publishes container ports, for the tests that use
// testcontainers-go (the pgfencetest and integration modules). Otherwise
// testcontainers-go, finding /.dockerenv (as on machines whose root
// filesystem was made from a container image), would take this process for
// one inside a container and reach ports through the default gateway.
func DockerAvailable(ctx context.Context) error {
	d, err := newDocker()
	if err != nil {
		return err
	}
	var info struct{ Name string }
	if err := d.call(ctx, http.MethodGet, "/info", nil, &info); err != nil {
		return fmt.Errorf("docker engine does not answer: %w", err)
	}
	if _, set := os.LookupEnv(envHostOverride); !set {
		if host, err := os.Hostname(); err == nil && host == info.Name {
			hostOverride.Do(func() { _ = os.Setenv(envHostOverride, "127.0.0.1") })
		}
	}
	return nil
}

const envHostOverride = "TESTCONTAINERS_HOST_OVERRIDE"

var hostOverride sync.Once

// startContainer starts PostgreSQL in a container when a Docker engine
// answers: the image's own entrypoint initialises it (POSTGRES_* variables,
// as the official image reads them), its port is published on 127.0.0.1,
// and it is ready once a query over TCP succeeds (the entrypoint's first,
// temporary server listens on no TCP port). The container is removed by the
// returned server's stop, and on any failure here.
func startContainer() (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := DockerAvailable(ctx)
	cancel()
	if err != nil {
		return nil, err
	}
	d, err := newDocker()
	if err != nil {
		return nil, err
	}
	img := ContainerImage()
	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var created struct{ ID string }
	err = d.call(ctx, http.MethodPost, "/containers/create", map[string]any{
		"Image": img,
		"Env": []string{
			"POSTGRES_USER=postgres", "POSTGRES_DB=postgres",
			// As the servers CI and pgcluster give the tests: roles that
			// tests create without a password can connect over TCP. No
			// password in the tests' URLs either: the CLI redacts every
			// piece of one from what it prints ("postgres" would turn
			// "expires" into "expixxxxx").
			"POSTGRES_HOST_AUTH_METHOD=trust",
		},
		"Cmd":          []string{"postgres", "-c", "fsync=off", "-c", "max_connections=200"},
		"ExposedPorts": map[string]any{"5432/tcp": map[string]any{}},
		"Labels":       map[string]string{"org.pgfence.pgtest": "1"},
		"HostConfig": map[string]any{
			"PortBindings": map[string]any{"5432/tcp": []map[string]string{{"HostIp": "127.0.0.1", "HostPort": ""}}},
		},
	}, &created)
	if err != nil {
		return nil, fmt.Errorf("create a container from %s (set %s to another image): %w", img, EnvImage, err)
	}
	remove := func() error {
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return d.call(rctx, http.MethodDelete, "/containers/"+created.ID+"?force=true&v=true", nil, nil)
	}
	fail := func(err error) (*server, error) { return nil, errors.Join(err, remove()) }
	if err := d.call(ctx, http.MethodPost, "/containers/"+created.ID+"/start", nil, nil); err != nil {
		return fail(fmt.Errorf("start the %s container: %w", img, err))
	}
	var inspect struct {
		NetworkSettings struct {
			Ports map[string][]struct{ HostIP, HostPort string }
		}
	}
	if err := d.call(ctx, http.MethodGet, "/containers/"+created.ID+"/json", nil, &inspect); err != nil {
		return fail(err)
	}
	binds := inspect.NetworkSettings.Ports["5432/tcp"]
	if len(binds) == 0 || binds[0].HostPort == "" {
		return fail(fmt.Errorf("the %s container published no port for 5432/tcp", img))
	}
	u := "postgres://postgres@" + net.JoinHostPort("127.0.0.1", binds[0].HostPort) + "/postgres?sslmode=disable"
	if err := waitReady(ctx, u); err != nil {
		return fail(fmt.Errorf("the %s container: %w", img, err))
	}
	return &server{
		adminURL: u,
		source:   "a container (" + img + ", Docker Engine API)",
		stop:     remove,
	}, nil
}

// waitReady polls until a query over u succeeds or ctx ends. It polls a
// condition no channel can signal (a server starting in a container).
func waitReady(ctx context.Context, u string) error {
	var last error
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(cctx, u)
		if err == nil {
			_, err = conn.Exec(cctx, "SELECT 1")
			_ = conn.Close(cctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready: %w", last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// isContainerProvisioner reports whether p names the container provisioner
// ("container", or "testcontainers" as CI and earlier docs call it).
func isContainerProvisioner(p string) bool {
	return strings.EqualFold(p, "container") || strings.EqualFold(p, "testcontainers")
}
