package proxycost

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Target is one proxy under test (or none: direct). Addr is where the
// clients send; PIDs are the processes whose CPU and memory count as the
// proxy's (empty for direct: nothing to measure).
type Target struct {
	Name string
	Addr string
	PIDs []int

	cmd    *exec.Cmd
	logOut *os.File
	dir    string
}

// ExternalTarget parses a user's NAME=HOST:PORT[,pid=PID] flag value: a
// proxy already running, pointed at the upstream the harness prints.
func ExternalTarget(spec string) (Target, error) {
	name, rest, ok := strings.Cut(spec, "=")
	if !ok || name == "" || rest == "" {
		return Target{}, fmt.Errorf("--target %q: want NAME=HOST:PORT[,pid=PID]", spec)
	}
	t := Target{Name: name}
	parts := strings.Split(rest, ",")
	t.Addr = parts[0]
	for _, p := range parts[1:] {
		v, ok := strings.CutPrefix(p, "pid=")
		pid, err := strconv.Atoi(v)
		if !ok || err != nil || pid <= 0 {
			return Target{}, fmt.Errorf("--target %q: %q is not pid=PID", spec, p)
		}
		t.PIDs = append(t.PIDs, pid)
	}
	return t, nil
}

// stop ends a process the harness started; a target it did not start is
// left alone.
func (t *Target) stop() {
	if t.cmd != nil && t.cmd.Process != nil {
		t.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck
		done := make(chan struct{})
		go func() { t.cmd.Wait(); close(done) }() //nolint:errcheck
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.cmd.Process.Kill() //nolint:errcheck
			<-done
		}
	}
	if t.logOut != nil {
		t.logOut.Close()
	}
	if t.dir != "" {
		os.RemoveAll(t.dir)
	}
}

// freePort finds a loopback port nothing listens on now.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startProcess runs argv with its output in dir/name.log and waits until
// addr accepts connections.
func startProcess(ctx context.Context, name string, argv, env []string, dir, addr string) (Target, error) {
	t := Target{Name: name, Addr: addr, dir: dir}
	f, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return t, err
	}
	t.logOut = f
	t.cmd = exec.Command(argv[0], argv[1:]...)
	t.cmd.Stdout, t.cmd.Stderr = f, f
	t.cmd.Dir = dir
	if env != nil {
		t.cmd.Env = append(os.Environ(), env...)
	}
	if err := t.cmd.Start(); err != nil {
		t.stop()
		return Target{}, fmt.Errorf("%s: %w", name, err)
	}
	t.PIDs = []int{t.cmd.Process.Pid}
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return t, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.stop()
			log, _ := os.ReadFile(filepath.Join(dir, name+".log"))
			return Target{}, fmt.Errorf("%s did not listen on %s: %v\n%s", name, addr, err, tail(log, 2000))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// StartBare starts argv0's bare fasthttp proxy (ServeBare, run by
// `gpurouter bench proxy-cost --serve-bare`) in front of upstream.
func StartBare(ctx context.Context, argv0 []string, upstream string) (Target, error) {
	return startFloor(ctx, "fasthttp-bare", "--serve-bare", argv0, upstream)
}

// StartLoop starts argv0's epoll-loop proxy (ServeLoop, run by
// `gpurouter bench proxy-cost --serve-loop`) in front of upstream.
func StartLoop(ctx context.Context, argv0 []string, upstream string) (Target, error) {
	return startFloor(ctx, "epoll-bare", "--serve-loop", argv0, upstream)
}

// startFloor starts one of argv0's floor proxies as column name: flag
// LISTEN in front of upstream.
func startFloor(ctx context.Context, name, flag string, argv0 []string, upstream string) (Target, error) {
	dir, err := os.MkdirTemp("", "proxycost-"+name+"-")
	if err != nil {
		return Target{}, err
	}
	addr, err := freePort()
	if err != nil {
		return Target{}, err
	}
	argv := append(append([]string(nil), argv0...), "bench", "proxy-cost", flag, addr, "--upstream", upstream)
	t, err := startProcess(ctx, name, argv, nil, dir, addr)
	if err != nil {
		os.RemoveAll(dir)
	}
	return t, err
}

// startGpurouter starts `argv0 serve` with its defaults (admission,
// telemetry, the JSON access log written to a file) and flags in front of
// upstream, as column name, with env added to the harness's environment.
func startGpurouter(ctx context.Context, name string, argv0, env, flags []string, upstream string) (Target, error) {
	dir, err := os.MkdirTemp("", "proxycost-gpurouter-")
	if err != nil {
		return Target{}, err
	}
	addr, err := freePort()
	if err != nil {
		return Target{}, err
	}
	argv := append(append(append([]string(nil), argv0...), "serve", "--listen", addr, "--pool", "m=http://"+upstream), flags...)
	t, err := startProcess(ctx, name, argv, env, dir, addr)
	if err != nil {
		os.RemoveAll(dir)
	}
	return t, err
}

// haproxyConfig is HAProxy as the issue measured it: one thread,
// leastconn, http-no-delay, keep-alive both ways, no logging.
const haproxyConfig = `global
    nbthread 1
    maxconn 8000
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    option http-no-delay
    http-reuse always
frontend fe
    bind %s
    default_backend be
backend be
    balance leastconn
    server u1 %s maxconn 4000
`

// StartHAProxy starts HAProxy in the foreground when it is installed;
// ErrNotInstalled when it is not.
func StartHAProxy(ctx context.Context, upstream string) (Target, error) {
	bin, err := findBin("haproxy")
	if err != nil {
		return Target{}, err
	}
	dir, err := os.MkdirTemp("", "proxycost-haproxy-")
	if err != nil {
		return Target{}, err
	}
	addr, err := freePort()
	if err != nil {
		return Target{}, err
	}
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, haproxyConfig, addr, upstream), 0o644); err != nil {
		return Target{}, err
	}
	t, err := startProcess(ctx, "haproxy", []string{bin, "-db", "-f", cfg}, nil, dir, addr)
	if err != nil {
		os.RemoveAll(dir)
	}
	return t, err
}

// nginxConfig is nginx as the issue measured it: one worker (and no
// master: the worker is the one process to measure), proxy_buffering off,
// a keep-alive upstream pool, no access log.
const nginxConfig = `daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile 16384;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
    upstream u { server %[3]s; keepalive 1024; }
    server {
        listen %[2]s;
        keepalive_requests 1000000;
        location / {
            proxy_pass http://u;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 120s;
        }
    }
}
`

// StartNginx starts nginx in the foreground when it is installed;
// ErrNotInstalled when it is not.
func StartNginx(ctx context.Context, upstream string) (Target, error) {
	bin, err := findBin("nginx")
	if err != nil {
		return Target{}, err
	}
	dir, err := os.MkdirTemp("", "proxycost-nginx-")
	if err != nil {
		return Target{}, err
	}
	addr, err := freePort()
	if err != nil {
		return Target{}, err
	}
	cfg := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, nginxConfig, dir, addr, upstream), 0o644); err != nil {
		return Target{}, err
	}
	t, err := startProcess(ctx, "nginx", []string{bin, "-p", dir, "-c", cfg, "-e", filepath.Join(dir, "error.log")}, nil, dir, addr)
	if err != nil {
		os.RemoveAll(dir)
	}
	return t, err
}

// ErrNotInstalled marks a comparison proxy that is not on this machine:
// its column is left out.
var ErrNotInstalled = errors.New("not installed")

// findBin looks for a daemon in PATH, then in /usr/sbin (Debian's place
// for it, often not in a user's PATH).
func findBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	p := filepath.Join("/usr/sbin", name)
	if st, err := os.Stat(p); err == nil && !st.IsDir() {
		return p, nil
	}
	return "", fmt.Errorf("%s: %w", name, ErrNotInstalled)
}
