package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// config is what the flags say.
type config struct {
	image   string
	replSet string
	timeout time.Duration
}

// imageRef is a plausible image reference: a name with an optional registry,
// path, tag and digest, no spaces nor shell characters.
var imageRef = regexp.MustCompile(`^[a-z0-9]([a-z0-9._/:-]*[a-z0-9])?(@sha256:[0-9a-f]{64})?$`)

// replSetName is a replica set name mongod accepts and a URI carries as is.
var replSetName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// parseFlags reads the command line; errors go to errOut as well as being
// returned.
func parseFlags(args []string, errOut io.Writer) (config, error) {
	fs := flag.NewFlagSet("mongodbserver", flag.ContinueOnError)
	fs.SetOutput(errOut)
	var cfg config
	fs.StringVar(&cfg.image, "image", "", "the MongoDB image, such as mongo:7.0 (required)")
	fs.StringVar(&cfg.replSet, "replset", "rs0", "the replica set's name")
	fs.DurationVar(&cfg.timeout, "timeout", 3*time.Minute, "how long the start may take, the image pull included")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	switch {
	case fs.NArg() > 0:
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	case cfg.image == "":
		return config{}, errors.New("-image is required, such as -image mongo:7.0")
	case !imageRef.MatchString(cfg.image):
		return config{}, fmt.Errorf("-image %q is not an image reference such as mongo:7.0", cfg.image)
	case !replSetName.MatchString(cfg.replSet):
		return config{}, fmt.Errorf("-replset %q: want 1 to 64 letters, digits, _ or -", cfg.replSet)
	case cfg.timeout <= 0:
		return config{}, fmt.Errorf("-timeout %v: want a positive duration", cfg.timeout)
	}
	return cfg, nil
}

// uriLine is the line that says where the server is.
func uriLine(uri string) string { return "URI " + uri }

// noDockerLine is the line that says no Docker engine answered, and why, on
// one line.
func noDockerLine(err error) string {
	return "NODOCKER " + strings.Join(strings.Fields(err.Error()), " ")
}

// directURI turns the connection string testcontainers-go gives (the
// published port, with replicaSet=NAME) into one that connects to that
// member directly: the replica set's member is named by the container's own
// address, which the host may not reach (Docker Desktop), while the published
// port always is. The server is still a replica set primary, so sessions,
// transactions and retryable writes are all there.
func directURI(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("the connection string %q: %w", s, err)
	}
	if u.Scheme != "mongodb" || u.Host == "" || strings.Contains(u.Host, ",") {
		return "", fmt.Errorf("the connection string %q: want mongodb://host:port", s)
	}
	q := u.Query()
	q.Del("replicaSet")
	q.Set("directConnection", "true")
	u.RawQuery = q.Encode()
	if u.Path == "" {
		u.Path = "/"
	}
	return u.String(), nil
}
