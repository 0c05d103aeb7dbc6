package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// EnvImage names the environment variable that sets the PostgreSQL image
// testcontainers-go starts; unset, it is DefaultImage. On a machine whose
// Docker engine reaches no registry, docker/build-images.sh builds a
// stand-in from Debian packages and prints the value to set.
const EnvImage = "PGFENCE_POSTGRES_IMAGE"

// DefaultImage is the upstream PostgreSQL image testcontainers-go starts
// when EnvImage is unset.
const DefaultImage = "postgres:17-alpine"

// ContainerImage returns the PostgreSQL image for containers: EnvImage's
// value, or DefaultImage.
func ContainerImage() string {
	if img := os.Getenv(EnvImage); img != "" {
		return img
	}
	return DefaultImage
}

// DockerAvailable reports whether a Docker engine answers, within a short
// timeout: the docker client alone (no engine) must not stall the tests.
//
// When the engine runs on this very host (its name is this host's name)
// and TESTCONTAINERS_HOST_OVERRIDE is unset, it sets that variable to
// 127.0.0.1, where Docker publishes container ports. Otherwise
// testcontainers-go, finding /.dockerenv (as on machines whose root
// filesystem was made from a container image), would take this process
// for one inside a container and reach ports through the default gateway.
func DockerAvailable(ctx context.Context) (err error) {
	defer func() {
		// testcontainers panics on some broken Docker configurations.
		if r := recover(); r != nil {
			err = fmt.Errorf("docker provider panicked: %v", r)
		}
	}()
	provider, err := testcontainers.NewDockerProvider()
	if err != nil {
		return fmt.Errorf("no docker provider: %w", err)
	}
	defer provider.Close()
	info, err := provider.Client().Info(ctx, client.InfoOptions{})
	if err != nil {
		return fmt.Errorf("docker engine does not answer: %w", err)
	}
	if _, set := os.LookupEnv(envHostOverride); !set {
		if host, err := os.Hostname(); err == nil && host == info.Info.Name {
			hostOverride.Do(func() { _ = os.Setenv(envHostOverride, "127.0.0.1") })
		}
	}
	return nil
}

const envHostOverride = "TESTCONTAINERS_HOST_OVERRIDE"

var hostOverride sync.Once

// startContainer starts PostgreSQL with testcontainers-go's postgres module
// when a Docker engine answers.
func startContainer() (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := DockerAvailable(ctx)
	cancel()
	if err != nil {
		return nil, err
	}
	img := ContainerImage()
	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ctr, err := tcpostgres.Run(ctx, img,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		// As the servers CI and pgcluster give the tests: roles that
		// tests create without a password can connect over TCP.
		testcontainers.WithEnv(map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust"}),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		if ctr != nil {
			err = errors.Join(err, testcontainers.TerminateContainer(ctr))
		}
		return nil, fmt.Errorf("start %s (set %s to another image): %w", img, EnvImage, err)
	}
	u, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return nil, errors.Join(fmt.Errorf("container connection string: %w", err), testcontainers.TerminateContainer(ctr))
	}
	return &server{
		adminURL: u,
		source:   "testcontainers (" + img + ")",
		stop:     func() error { return testcontainers.TerminateContainer(ctr) },
	}, nil
}
