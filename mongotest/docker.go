package mongotest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// The Docker backend runs the command github.com/mongocas/mongocas/mongotest/
// mongodbserver in a child process, like the embedded server: it starts
// MongoDB through testcontainers-go's MongoDB module, whose Docker client
// never enters the module graph of a module that uses mongotest. mongotest
// itself only looks for a socket where an engine may listen (a dial, no API
// call); the child asks the engine through testcontainers-go, and says
// NODOCKER when none answers, which makes Start fall back to the embedded
// server (unless MONGOCAS_BACKEND=docker). If the test process dies, the
// child's standard input closes and it removes the container; if the child
// dies too, testcontainers-go's reaper (Ryuk) removes it.

// EnvMongoDBVersion picks the MongoDB the Docker backend runs: the image
// mongo:<version>, such as 6.0, 7.0 or 8.0. MONGOCAS_DOCKER_IMAGE, when set,
// names the image instead.
const EnvMongoDBVersion = "MONGOCAS_MONGODB_VERSION"

// DefaultMongoDBVersion is the MongoDB version the Docker backend runs when
// neither EnvMongoDBVersion nor EnvDockerImage is set.
const DefaultMongoDBVersion = "7.0"

// mongoVersion is a MongoDB version as the mongo image tags it.
var mongoVersion = regexp.MustCompile(`^[0-9]+\.[0-9]+(\.[0-9]+)?$`)

// dockerImage returns the image the Docker backend runs.
func dockerImage() (string, error) {
	if img := os.Getenv(EnvDockerImage); img != "" {
		return img, nil
	}
	v := os.Getenv(EnvMongoDBVersion)
	if v == "" {
		return DefaultDockerImage, nil
	}
	if !mongoVersion.MatchString(v) {
		return "", tag(errBadSetting, fmt.Errorf("%s=%q: want a MongoDB version such as 6.0, 7.0 or 8.0", EnvMongoDBVersion, v))
	}
	return "mongo:" + v, nil
}

// dockerPlace is where a Docker engine may be: what to tell the child, and
// how to name it in messages.
type dockerPlace struct {
	where string   // "DOCKER_HOST=unix:///...", or the socket found
	env   []string // DOCKER_HOST for the child, when found elsewhere
}

// defaultSockets are the places Docker engines listen on when DOCKER_HOST is
// not set: the system socket, rootless Docker, Docker Desktop, Colima and
// Rancher Desktop.
func defaultSockets() []string {
	socks := []string{"/var/run/docker.sock"}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		socks = append(socks, filepath.Join(d, "docker.sock"))
	}
	if h, err := os.UserHomeDir(); err == nil {
		socks = append(socks,
			filepath.Join(h, ".docker", "run", "docker.sock"),
			filepath.Join(h, ".docker", "desktop", "docker.sock"),
			filepath.Join(h, ".colima", "default", "docker.sock"),
			filepath.Join(h, ".rd", "docker.sock"))
	}
	return socks
}

// dockerDialTimeout bounds each dial of findDocker.
const dockerDialTimeout = 2 * time.Second

// findDocker looks for a place where a Docker engine may listen, without
// speaking its API: DOCKER_HOST (a unix or tcp address must accept a
// connection; another scheme is left to testcontainers-go), a docker.host in
// ~/.testcontainers.properties, else the first of the default sockets that
// accepts a connection. When there is none, why says what was tried.
func findDocker(ctx context.Context) (p dockerPlace, why string, ok bool) {
	dial := func(network, addr string) error {
		d := net.Dialer{Timeout: dockerDialTimeout}
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		p.where = "DOCKER_HOST=" + h
		u, err := url.Parse(h)
		if err != nil {
			return p, fmt.Sprintf("%s: %v", p.where, err), false
		}
		switch u.Scheme {
		case "unix":
			err = dial("unix", u.Path)
		case "tcp":
			err = dial("tcp", u.Host)
		}
		if err != nil {
			return p, fmt.Sprintf("%s: %v", p.where, err), false
		}
		return p, "", true
	}
	if h := propertiesDockerHost(); h != "" {
		return dockerPlace{where: "docker.host=" + h + " in ~/.testcontainers.properties"}, "", true
	}
	socks := defaultSockets()
	for i, s := range socks {
		if dial("unix", s) == nil {
			p = dockerPlace{where: "unix://" + s}
			if i > 0 {
				p.env = []string{"DOCKER_HOST=unix://" + s}
			}
			return p, "", true
		}
	}
	return dockerPlace{where: "unix://" + socks[0]}, fmt.Sprintf("no Docker socket accepts a connection at %s (DOCKER_HOST is not set)", strings.Join(socks, ", ")), false
}

// propertiesDockerHost returns the docker.host that testcontainers-go's
// properties file sets, if any.
func propertiesDockerHost() string {
	h, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	f, err := os.Open(filepath.Join(h, ".testcontainers.properties"))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if ok && strings.TrimSpace(k) == "docker.host" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// noDockerError is the Docker backend's child saying that no Docker engine
// answers; Start falls back to the embedded server on it (unless
// MONGOCAS_BACKEND=docker).
type noDockerError struct{ reason string }

func (e *noDockerError) Error() string {
	return "no Docker engine answered: " + e.reason
}

// parseDockerLine reads the first line of the Docker backend's child: "URI
// mongodb://..." or "NODOCKER reason" (a *noDockerError).
func parseDockerLine(line string) (string, error) {
	if reason, ok := strings.CutPrefix(line, "NODOCKER "); ok {
		return "", &noDockerError{reason: strings.TrimSpace(reason)}
	}
	uri, ok := strings.CutPrefix(line, "URI ")
	if !ok {
		return "", fmt.Errorf("its first line is %q, not URI or NODOCKER", line)
	}
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "mongodb" || u.Host == "" {
		return "", fmt.Errorf("its first line is %q, not URI mongodb://host:port", line)
	}
	return uri, nil
}

// dockerStartTimeout bounds the child's start (the image pull included) when
// ctx has no deadline.
const dockerStartTimeout = 3 * time.Minute

// runDocker starts a single-node MongoDB replica set in Docker through the
// child command.
func runDocker(ctx context.Context, p dockerPlace) (*Server, error) {
	img, err := dockerImage()
	if err != nil {
		return nil, err
	}
	bin, err := buildChild(ctx, mongodbServer)
	if err != nil {
		return nil, fmt.Errorf("docker backend: %w", err)
	}
	timeout := dockerStartTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(dl), time.Second)
	}
	line, stop, err := runChild(ctx, bin, timeout+10*time.Second, p.env,
		"-image", img, "-timeout", timeout.Round(time.Second).String())
	if err != nil {
		return nil, fmt.Errorf("docker backend (%s): %w", p.where, err)
	}
	uri, err := parseDockerLine(line)
	if err != nil {
		stop()
		return nil, fmt.Errorf("docker backend (%s): %s: %w", p.where, bin, err)
	}
	s, err := connect(ctx, uri, BackendDocker)
	if err != nil {
		stop()
		return nil, fmt.Errorf("docker backend: %s: %w", img, err)
	}
	s.upstream = faultUpstream(ctx, s.Client, uri)
	s.stop = func() {
		_ = s.Client.Disconnect(context.Background())
		stop()
	}
	return s, nil
}
