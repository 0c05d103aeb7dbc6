package pgtest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// ContainerImage is the PostgreSQL image testcontainers-go starts when a
// Docker engine answers.
const ContainerImage = "postgres:17-alpine"

// dockerAvailable reports whether a Docker engine answers, within a short
// timeout: the docker client alone (no engine) must not stall the tests.
func dockerAvailable(ctx context.Context) (err error) {
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
	// Health closes the provider.
	if err := provider.Health(ctx); err != nil {
		return fmt.Errorf("docker engine does not answer: %w", err)
	}
	return nil
}

// startContainer starts PostgreSQL with testcontainers-go's postgres module
// when a Docker engine answers.
func startContainer() (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := dockerAvailable(ctx)
	cancel()
	if err != nil {
		return nil, err
	}
	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ctr, err := tcpostgres.Run(ctx, ContainerImage,
		tcpostgres.WithDatabase("postgres"),
		tcpostgres.WithUsername("postgres"),
		tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		if ctr != nil {
			err = errors.Join(err, testcontainers.TerminateContainer(ctr))
		}
		return nil, fmt.Errorf("start %s: %w", ContainerImage, err)
	}
	u, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return nil, errors.Join(fmt.Errorf("container connection string: %w", err), testcontainers.TerminateContainer(ctr))
	}
	return &server{
		adminURL: u,
		source:   "testcontainers (" + ContainerImage + ")",
		stop:     func() error { return testcontainers.TerminateContainer(ctr) },
	}, nil
}
