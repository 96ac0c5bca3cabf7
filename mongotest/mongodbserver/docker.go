package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tclog "github.com/testcontainers/testcontainers-go/log"
	"github.com/testcontainers/testcontainers-go/modules/mongodb"
)

// dockerAnswers reports, as an error, why no Docker engine can be used:
// testcontainers-go finds none (DOCKER_HOST, its properties file, the usual
// sockets), or the one it finds does not answer within healthTimeout. Its
// lookup of the Docker host takes no context, so the wait is bounded here;
// a lookup still hanging when this returns ends with the process.
func dockerAnswers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- health(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no Docker engine answered within %v", healthTimeout)
	}
}

// health asks testcontainers-go for a Docker provider and checks it. A
// DOCKER_HOST that is set must answer itself: testcontainers-go would go on
// to the default socket, and its user meant that engine, not another.
func health(ctx context.Context) (err error) {
	defer func() {
		// testcontainers-go panics in some lookups of the Docker host (its
		// own SkipIfProviderIsNotHealthy recovers too).
		if r := recover(); r != nil {
			err = fmt.Errorf("looking for a Docker engine: %v", r)
		}
	}()
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		cli, err := client.New(client.FromEnv)
		if err != nil {
			return fmt.Errorf("DOCKER_HOST=%s: %w", h, err)
		}
		defer cli.Close()
		if _, err := cli.Info(ctx, client.InfoOptions{}); err != nil {
			return fmt.Errorf("DOCKER_HOST=%s: %w", h, err)
		}
	}
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return err
	}
	return p.Health(ctx) // closes p
}

// start runs the image as a single-node replica set and returns its URI.
// testcontainers-go's notes go to logger.
func start(ctx context.Context, cfg config, logger *log.Logger) (*server, error) {
	tclog.SetDefault(logger)
	c, err := mongodb.Run(ctx, cfg.image, mongodb.WithReplicaSet(cfg.replSet))
	stop := func() error { return testcontainers.TerminateContainer(c) }
	if err != nil {
		_ = stop()
		return nil, fmt.Errorf("start %s: %w", cfg.image, err)
	}
	raw, err := c.ConnectionString(ctx)
	if err == nil {
		var uri string
		if uri, err = directURI(raw); err == nil {
			return &server{uri: uri, stop: stop}, nil
		}
	}
	_ = stop()
	return nil, fmt.Errorf("%s: %w", cfg.image, err)
}
