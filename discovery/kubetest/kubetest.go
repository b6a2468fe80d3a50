// Package kubetest starts a real Kubernetes API server for tests: etcd and
// kube-apiserver as child processes on loopback, with free ports, in a
// t.TempDir(), stopped by t.Cleanup. It is for tests only (it takes a
// testing.TB); the discovery tests and the Helm chart tests share it.
//
// The server authenticates with static bearer tokens (--token-auth-file)
// and authorizes with RBAC (--authorization-mode=RBAC), so a test can act
// as the cluster admin (group system:masters), as the router's service
// account (ServiceAccountUser: what the chart's RoleBinding names), as a
// user with no permissions at all (NobodyUser), or as users of its own
// (WithUser). No controller runs: nothing creates pods' IPs, EndpointSlices
// or service-account tokens; a test writes what it needs itself (pod status
// through the status subresource, EndpointSlices directly). The
// ServiceAccount admission plugin is off for that reason, so pods need no
// "default" ServiceAccount.
//
// Binaries: kube-apiserver from $KUBE_APISERVER, else PATH, else the CI
// cache (${XDG_CACHE_HOME:-$HOME/.cache}/gpurouter-ci/bin, where
// .ci/kube-apiserver/build puts it); etcd from $ETCD, else PATH (Debian's
// etcd-server: /usr/bin/etcd), else the same cache. Missing ones skip the
// test with a one-line reason, or fail it under CI=true.
//
// Typical use:
//
//	c := kubetest.Start(t)
//	cs := c.Clientset(t)                            // admin
//	path := c.KubeconfigFor(t, kubetest.ServiceAccountUser)
//	c.InstallInferencePoolCRD(t)                    // when a test needs InferencePools
package kubetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Users every Cluster knows.
const (
	// AdminUser is in group system:masters: every permission, RBAC or not.
	AdminUser = "admin"
	// ServiceAccountUser is the name the API server gives the router's
	// service account (namespace gpurouter, name gpurouter), in the groups
	// a real service account token carries, so RoleBindings naming
	// ServiceAccount gpurouter/gpurouter apply to it.
	ServiceAccountUser = "system:serviceaccount:gpurouter:gpurouter"
	// NobodyUser is authenticated and has no permission RBAC's defaults
	// do not give every authenticated user.
	NobodyUser = "nobody"
)

// Cluster is a running API server. Build with Start; the zero value is
// unusable.
type Cluster struct {
	// Config is the admin's client configuration (a copy may be edited).
	Config *rest.Config
	// Version is the server's version, e.g. "v1.37.2".
	Version string
	// Dir holds the server's files: certificates, token file, logs.
	Dir string

	host   string // https://127.0.0.1:PORT
	caPEM  []byte
	tokens map[string]string // user → bearer token
}

// Option adds to what Start sets up.
type Option func(*options)

type options struct {
	users []user
}

type user struct {
	name   string
	groups []string
}

// WithUser makes the server accept a token for name, in groups (beside
// system:authenticated, which every token gets); Token and ConfigFor hand
// it out.
func WithUser(name string, groups ...string) Option {
	return func(o *options) { o.users = append(o.users, user{name, groups}) }
}

// Start starts etcd and kube-apiserver and waits until the server is ready
// (at most a minute). Both stop when t ends.
func Start(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	apiserver, etcd := binaries(t)
	o := options{users: []user{
		{AdminUser, []string{"system:masters"}},
		{ServiceAccountUser, []string{"system:serviceaccounts", "system:serviceaccounts:gpurouter"}},
		{NobodyUser, nil},
	}}
	for _, opt := range opts {
		opt(&o)
	}
	dir := t.TempDir()
	c := &Cluster{Dir: dir, tokens: map[string]string{}}

	etcdURL := startEtcd(t, etcd, dir)

	pki, err := writePKI(dir)
	if err != nil {
		t.Fatalf("kubetest: certificates: %v", err)
	}
	c.caPEM = pki.caPEM
	var tokens strings.Builder
	for i, u := range o.users {
		tok := randomToken()
		c.tokens[u.name] = tok
		fmt.Fprintf(&tokens, "%s,%s,uid-%d,%q\n", tok, u.name, i, strings.Join(u.groups, ","))
	}
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(tokens.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	c.host = fmt.Sprintf("https://127.0.0.1:%d", port)
	startProcess(t, "kube-apiserver", apiserver, filepath.Join(dir, "kube-apiserver.log"),
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--cert-dir="+dir,
		"--tls-cert-file="+pki.certFile,
		"--tls-private-key-file="+pki.keyFile,
		"--client-ca-file="+pki.caFile,
		"--authorization-mode=RBAC",
		"--token-auth-file="+tokenFile,
		"--anonymous-auth=false",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+pki.saPubFile,
		"--service-account-signing-key-file="+pki.saKeyFile,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--disable-admission-plugins=ServiceAccount",
		"--allow-privileged=true",
		"--endpoint-reconciler-type=none",
		"--profiling=false",
	)
	c.Config = c.ConfigFor(AdminUser)
	c.Version = c.waitReady(t, filepath.Join(dir, "kube-apiserver.log"))
	return c
}

// Token is user's bearer token; it panics for a user Start was not
// given (a mistake in the test, not a condition it meets).
func (c *Cluster) Token(user string) string {
	tok, ok := c.tokens[user]
	if !ok {
		panic("kubetest: unknown user " + user + " (declare it with WithUser)")
	}
	return tok
}

// ConfigFor is a client configuration acting as user.
func (c *Cluster) ConfigFor(user string) *rest.Config {
	return &rest.Config{
		Host:            c.host,
		BearerToken:     c.Token(user),
		TLSClientConfig: rest.TLSClientConfig{CAData: c.caPEM},
		QPS:             100,
		Burst:           200,
	}
}

// KubeconfigFor writes a kubeconfig file acting as user (its token, the
// server's CA) and returns its path; what `--kubeconfig` takes.
func (c *Cluster) KubeconfigFor(t testing.TB, user string) string {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: c.host, CertificateAuthorityData: c.caPEM}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: c.Token(user)}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: user}
	cfg.CurrentContext = "test"
	path := filepath.Join(c.Dir, "kubeconfig-"+strings.NewReplacer(":", "_", "/", "_").Replace(user))
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatalf("kubetest: kubeconfig: %v", err)
	}
	return path
}

// Clientset is the admin's typed client.
func (c *Cluster) Clientset(t testing.TB) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// Dynamic is the admin's dynamic client (custom resources, applying
// rendered manifests).
func (c *Cluster) Dynamic(t testing.TB) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// waitReady polls /readyz until it answers ok and returns the server's
// version; t fails with the log's tail after a minute.
func (c *Cluster) waitReady(t testing.TB, logFile string) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var last error
	for ctx.Err() == nil {
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && string(body) == "ok" {
			v, err := cs.Discovery().ServerVersion()
			if err != nil {
				t.Fatalf("kubetest: server version: %v", err)
			}
			return v.GitVersion
		}
		last = errors.Join(err, errors.New(string(body)))
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("kubetest: kube-apiserver not ready within a minute: %v\n%s", last, tail(logFile))
	return ""
}

// startEtcd starts etcd on two free loopback ports and returns its client
// URL once it answers.
func startEtcd(t testing.TB, bin, dir string) string {
	t.Helper()
	client := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	logFile := filepath.Join(dir, "etcd.log")
	startProcess(t, "etcd", bin, logFile,
		"--name=kubetest",
		"--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster=kubetest="+peer,
		"--log-level=warn",
	)
	// kube-apiserver retries etcd itself, but a dead etcd reads better as
	// etcd's own log than as an API server timeout.
	addr := strings.TrimPrefix(client, "http://")
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return client
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("kubetest: etcd not listening within 30s\n%s", tail(logFile))
	return ""
}

// startProcess runs bin with args, its output in logFile, and stops it
// (SIGTERM, then SIGKILL after 10 s) when t ends.
func startProcess(t testing.TB, name, bin, logFile string, args ...string) {
	t.Helper()
	out, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = childAttrs()
	if err := cmd.Start(); err != nil {
		out.Close()
		t.Fatalf("kubetest: start %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(terminate)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
}

// binaries finds kube-apiserver and etcd, or skips (fails under CI=true).
func binaries(t testing.TB) (apiserver, etcd string) {
	t.Helper()
	apiserver = find("KUBE_APISERVER", "kube-apiserver")
	etcd = find("ETCD", "etcd")
	var missing []string
	if apiserver == "" {
		missing = append(missing, "kube-apiserver ($KUBE_APISERVER, PATH or "+CacheDir()+"; build it with .ci/kube-apiserver/build)")
	}
	if etcd == "" {
		missing = append(missing, "etcd ($ETCD or PATH; Debian package etcd-server)")
	}
	if len(missing) > 0 {
		msg := "kubetest: no " + strings.Join(missing, " and no ")
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return apiserver, etcd
}

// CacheDir is where .ci/run caches the binaries it builds.
func CacheDir() string {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "gpurouter-ci", "bin")
}

// find looks for a binary in $env, PATH, then CacheDir.
func find(env, name string) string {
	if p := os.Getenv(env); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
		return ""
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if p := filepath.Join(CacheDir(), name); isExecutable(p) {
		return p
	}
	return ""
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// freePort is a loopback TCP port free at the time of asking.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// tail is the last few KB of a log, for failure messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
