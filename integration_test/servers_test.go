package integration_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/pgfence/pgfence/internal/pgtest"
	"github.com/pgfence/pgfence/migrations"
)

// pgServer is a PostgreSQL server that one test owns and may stop and
// start again, for the scenarios that attack the server itself. Its URLs
// stay valid across restarts.
type pgServer interface {
	// URL is a connection URL for database db as a superuser.
	URL(db string) string
	// Stop shuts the server down: "fast" (clients are disconnected, a
	// checkpoint is written) or "immediate" (no checkpoint: crash recovery
	// at the next start).
	Stop(mode string) error
	// Start starts it again and waits until it accepts connections.
	Start() error
}

// containerImage is the image of the container-backed factory
// (PGFENCE_POSTGRES_IMAGE, default postgres:17-alpine).
var containerImage = pgtest.ContainerImage()

// startServer starts a migrated server of the test's own. The factory is
// testcontainers-go's postgres module when a Docker engine answers, the
// machine's PostgreSQL binaries (pgtest.StartCluster) otherwise; the test
// log says which one ran.
func startServer(t *testing.T) pgServer {
	t.Helper()
	var s pgServer
	if err := dockerAnswers(); err == nil {
		t.Logf("server factory: testcontainers-go, %s", containerImage)
		s = startContainerServer(t)
	} else {
		t.Logf("server factory: local throwaway cluster (pgtest.StartCluster); no Docker engine: %v", err)
		s = localServer{pgtest.StartCluster(t)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := migrations.Up(ctx, s.URL("postgres")); err != nil {
		t.Fatalf("migrate the test's server: %v", err)
	}
	return s
}

// localServer is a throwaway cluster from the machine's binaries.
type localServer struct{ c *pgtest.Cluster }

func (s localServer) URL(db string) string   { return s.c.URL(db) }
func (s localServer) Stop(mode string) error { return s.c.Stop(mode) }
func (s localServer) Start() error           { return s.c.Start() }

var (
	dockerOnce sync.Once
	dockerErr  error
)

// dockerAnswers reports, once per process, whether a Docker engine answers
// within 5s.
func dockerAnswers() error {
	dockerOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		dockerErr = pgtest.DockerAvailable(ctx)
	})
	return dockerErr
}

// containerServer is a postgres container. Docker may map a different host
// port after a restart, so clients connect through a proxy that looks the
// port up for every new connection: URLs stay valid.
type containerServer struct {
	ctr   *tcpostgres.PostgresContainer
	proxy *proxy
}

func startContainerServer(t *testing.T) *containerServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ctr, err := tcpostgres.Run(ctx, containerImage,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if ctr != nil {
		t.Cleanup(func() {
			if err := testcontainers.TerminateContainer(ctr); err != nil {
				t.Errorf("terminate %s: %v", containerImage, err)
			}
		})
	}
	if err != nil {
		t.Fatalf("start %s: %v", containerImage, err)
	}
	var d net.Dialer
	p := startProxyDial(t, func(ctx context.Context) (net.Conn, error) {
		addr, err := ctr.PortEndpoint(ctx, "5432/tcp", "")
		if err != nil {
			return nil, fmt.Errorf("container port: %w", err)
		}
		return d.DialContext(ctx, "tcp", addr)
	})
	return &containerServer{ctr: ctr, proxy: p}
}

func (s *containerServer) URL(db string) string {
	return fmt.Sprintf("postgres://postgres:postgres@%s/%s?sslmode=disable", s.proxy.Addr(), db)
}

// Stop stops the container: docker stop sends the image's stop signal
// (SIGINT: a fast shutdown) and waits; "immediate" gives it no time, so
// the server is killed as by a crash.
func (s *containerServer) Stop(mode string) error {
	var timeout time.Duration
	switch mode {
	case "fast":
		timeout = 30 * time.Second
	case "immediate":
		timeout = 0
	default:
		return fmt.Errorf("container server: unknown shutdown mode %q", mode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.ctr.Stop(ctx, &timeout); err != nil {
		return fmt.Errorf("stop %s: %w", containerImage, err)
	}
	s.proxy.Cut() // the container's network is gone; so are its connections
	return nil
}

// Start starts the container again; its wait strategy waits until
// PostgreSQL accepts connections.
func (s *containerServer) Start() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.ctr.Start(ctx); err != nil {
		return fmt.Errorf("start %s: %w", containerImage, err)
	}
	return nil
}
