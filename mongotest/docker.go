package mongotest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The Docker backend talks to the Docker Engine API over HTTP itself, at
// DOCKER_HOST or the default socket, rather than through testcontainers-go,
// whose Docker client, OpenTelemetry and system-information modules would
// all enter the module graph of every module that uses mongotest. What
// testcontainers' reaper container did, removing the containers of a test
// process that died before it could, is done at the next start on the same
// machine: each container is labelled with its owner's host name and process
// id, and those whose owner has exited are removed.

// ownerLabel labels the containers mongotest starts with "host/pid".
const ownerLabel = "org.mongocas.mongotest.owner"

// dockerEngine is a client of the Docker Engine API.
type dockerEngine struct {
	hc *http.Client
	// host is where a published port is reached: 127.0.0.1 for a local
	// socket, DOCKER_HOST's host for tcp.
	host string
	// bindIP is the address published ports bind on the engine's host.
	bindIP string
}

// dockerEndpoint returns the network and address of the engine: DOCKER_HOST,
// or the default socket.
func dockerEndpoint() (network, addr string, err error) {
	h := os.Getenv("DOCKER_HOST")
	if h == "" {
		return "unix", "/var/run/docker.sock", nil
	}
	u, err := url.Parse(h)
	if err != nil {
		return "", "", fmt.Errorf("DOCKER_HOST=%s: %w", h, err)
	}
	switch u.Scheme {
	case "unix":
		return "unix", u.Path, nil
	case "tcp":
		return "tcp", u.Host, nil
	}
	return "", "", fmt.Errorf("DOCKER_HOST=%s: only unix:// and tcp:// are supported", h)
}

func newDockerEngine() (*dockerEngine, error) {
	network, addr, err := dockerEndpoint()
	if err != nil {
		return nil, err
	}
	e := &dockerEngine{host: "127.0.0.1", bindIP: "127.0.0.1"}
	if network == "tcp" {
		h, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("DOCKER_HOST: %w", err)
		}
		e.host, e.bindIP = h, ""
	}
	e.hc = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}}
	return e, nil
}

// call sends a request to the engine and decodes a JSON reply into out (when
// not nil). A status of 300 or more is an error with the engine's message.
func (e *dockerEngine) call(ctx context.Context, method, path string, body, out any) error {
	resp, err := e.send(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// engineError is an error reply of the engine.
type engineError struct {
	status int
	msg    string
}

func (e *engineError) Error() string { return fmt.Sprintf("%d %s", e.status, e.msg) }

func (e *dockerEngine) send(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://docker"+path, r) //nolint:gosec // G704: the path is an engine API path built here; the client only dials the local Docker engine, so nothing can be made to reach another host
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.hc.Do(req) //nolint:gosec // G704: as above, a request to the local Docker engine
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		var m struct {
			Message string `json:"message"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &m) != nil || m.Message == "" {
			m.Message = strings.TrimSpace(string(b))
		}
		return nil, fmt.Errorf("%s %s: %w", method, path, &engineError{resp.StatusCode, m.Message})
	}
	return resp, nil
}

// splitImage splits an image reference into the fromImage and tag of an image
// pull ("mongo:7.0" is mongo and 7.0; a reference by digest keeps it whole).
func splitImage(img string) (name, tag string) {
	if strings.Contains(img, "@") {
		return img, ""
	}
	if i := strings.LastIndex(img, ":"); i > strings.LastIndex(img, "/") {
		return img[:i], img[i+1:]
	}
	return img, "latest"
}

// pull pulls img unless the engine has it, saying so every few seconds.
func (e *dockerEngine) pull(ctx context.Context, img string) error {
	err := e.call(ctx, http.MethodGet, "/images/"+img+"/json", nil, nil)
	var ee *engineError
	if err == nil || !errors.As(err, &ee) || ee.status != http.StatusNotFound {
		return err
	}
	name, tag := splitImage(img)
	q := url.Values{"fromImage": {name}}
	if tag != "" {
		q.Set("tag", tag)
	}
	noticef("mongotest: pulling the Docker image %s (once)", img)
	began := time.Now()
	resp, err := e.send(ctx, http.MethodPost, "/images/create?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	last := time.Now()
	for {
		var msg struct {
			Status string `json:"status"`
			Error  string `json:"error"`
		}
		if err := dec.Decode(&msg); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("pull %s: %w", img, err)
		}
		if msg.Error != "" {
			return fmt.Errorf("pull %s: %s", img, msg.Error)
		}
		if time.Since(last) >= progressEvery {
			noticef("mongotest: still pulling %s: %s so far (%s)", img, round(time.Since(began)), msg.Status)
			last = time.Now()
		}
	}
	noticef("mongotest: pulled %s in %s", img, round(time.Since(began)))
	return nil
}

// owner is the value of ownerLabel for this process.
func owner() string {
	h, _ := os.Hostname()
	return h + "/" + strconv.Itoa(os.Getpid())
}

// reap removes the containers mongotest started on this machine for
// processes that have exited.
func (e *dockerEngine) reap(ctx context.Context) {
	filters, err := json.Marshal(map[string][]string{"label": {ownerLabel}})
	if err != nil {
		return
	}
	var list []struct {
		ID     string            `json:"Id"`
		Labels map[string]string `json:"Labels"`
	}
	if e.call(ctx, http.MethodGet, "/containers/json?all=1&filters="+url.QueryEscape(string(filters)), nil, &list) != nil {
		return
	}
	me, _ := os.Hostname()
	for _, c := range list {
		host, pid, ok := strings.Cut(c.Labels[ownerLabel], "/")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || host != me || processAlive(n) {
			continue
		}
		_ = e.remove(ctx, c.ID)
	}
}

func (e *dockerEngine) remove(ctx context.Context, id string) error {
	return e.call(ctx, http.MethodDelete, "/containers/"+id+"?force=1&v=1", nil, nil)
}

// run starts a container of img running cmd with port published, and returns
// the address it is reached at and the function that removes it.
func (e *dockerEngine) run(ctx context.Context, img string, cmd []string, port string) (addr string, remove func(), err error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "mongotest-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b[:])
	var created struct {
		ID string `json:"Id"`
	}
	err = e.call(ctx, http.MethodPost, "/containers/create?name="+name, map[string]any{
		"Image":        img,
		"Cmd":          cmd,
		"ExposedPorts": map[string]any{port: struct{}{}},
		"Labels":       map[string]string{ownerLabel: owner()},
		"HostConfig": map[string]any{
			"PortBindings": map[string]any{port: []map[string]string{{"HostIp": e.bindIP, "HostPort": ""}}},
			"AutoRemove":   true,
		},
	}, &created)
	if err != nil {
		return "", nil, fmt.Errorf("create a container of %s: %w", img, err)
	}
	remove = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = e.remove(ctx, created.ID)
	}
	defer func() {
		if err != nil {
			remove()
		}
	}()
	if err := e.call(ctx, http.MethodPost, "/containers/"+created.ID+"/start", nil, nil); err != nil {
		return "", nil, fmt.Errorf("start the container of %s: %w", img, err)
	}
	var inspect struct {
		NetworkSettings struct {
			Ports map[string][]struct {
				HostPort string `json:"HostPort"`
			} `json:"Ports"`
		} `json:"NetworkSettings"`
	}
	if err := e.call(ctx, http.MethodGet, "/containers/"+created.ID+"/json", nil, &inspect); err != nil {
		return "", nil, err
	}
	bindings := inspect.NetworkSettings.Ports[port]
	if len(bindings) == 0 || bindings[0].HostPort == "" {
		return "", nil, fmt.Errorf("the container of %s published no port for %s", img, port)
	}
	return net.JoinHostPort(e.host, bindings[0].HostPort), remove, nil
}

// runDocker starts a single-node MongoDB replica set in a container.
func runDocker(ctx context.Context) (*Server, error) {
	img := os.Getenv(EnvDockerImage)
	if img == "" {
		img = DefaultDockerImage
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	e, err := newDockerEngine()
	if err != nil {
		return nil, fmt.Errorf("docker backend: %w", err)
	}
	defer e.hc.CloseIdleConnections()
	e.reap(ctx)
	if err := e.pull(ctx, img); err != nil {
		return nil, fmt.Errorf("docker backend: %w", err)
	}
	addr, remove, err := e.run(ctx, img, []string{"mongod", "--replSet", "rs0", "--bind_ip_all"}, "27017/tcp")
	if err != nil {
		return nil, fmt.Errorf("docker backend: %w", err)
	}
	uri := "mongodb://" + addr + "/?directConnection=true"
	if err := initiateReplicaSet(ctx, uri); err != nil {
		remove()
		return nil, fmt.Errorf("docker backend: %s: %w", img, err)
	}
	s, err := connect(ctx, uri, BackendDocker)
	if err != nil {
		remove()
		return nil, fmt.Errorf("docker backend: %w", err)
	}
	s.upstream = faultUpstream(ctx, s.Client, uri)
	s.stop = func() {
		_ = s.Client.Disconnect(context.Background())
		remove()
	}
	return s, nil
}

// initiateReplicaSet waits for the mongod at uri to answer, makes it a
// single-node replica set and waits for it to become primary.
func initiateReplicaSet(ctx context.Context, uri string) error {
	client, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(2 * time.Second))
	if err != nil {
		return err
	}
	defer func() { _ = client.Disconnect(context.WithoutCancel(ctx)) }()
	admin := client.Database("admin")
	initiated := false
	for {
		if !initiated {
			err = admin.RunCommand(ctx, bson.D{{Key: "replSetInitiate", Value: bson.D{}}}).Err()
			var ce mongo.CommandError
			if err == nil || (errors.As(err, &ce) && ce.Name == "AlreadyInitialized") {
				initiated = true
			}
		}
		if initiated {
			var hello struct {
				Primary bool `bson:"isWritablePrimary"`
			}
			err = admin.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello)
			if err == nil && hello.Primary {
				return nil
			}
			if err == nil {
				err = errors.New("not primary yet")
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replica set not ready: %w (last: %w)", ctx.Err(), err)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
