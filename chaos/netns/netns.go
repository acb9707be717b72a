package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every namespace this package creates.
const Prefix = "wchaos-"

// BridgeNS is the namespace that holds the bridge (and the fault rules).
const BridgeNS = Prefix + "br"

// Subnet is the /24 the nodes' addresses are taken from.
const Subnet = "198.18.0"

// LockFile serializes runs: the holder owns every name under Prefix.
const LockFile = "/run/wchaos.lock"

// Errors of this package.
var (
	// ErrUnavailable means the machine cannot run the harness (not root,
	// a tool missing, namespaces refused); the message says which.
	ErrUnavailable = errors.New("network namespaces unavailable")
	// ErrBusy means another run holds the lock.
	ErrBusy = errors.New("another chaos run holds " + LockFile)
)

// Tools are the programs the harness runs (Debian packages iproute2,
// nftables, iptables; scripts/install-deps.sh installs them).
var Tools = []string{"ip", "nft", "iptables"}

// Available reports why the harness cannot run here (nil when it can):
// it needs root, the tools, and a namespace it can create and remove.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: needs root (network namespaces, nftables, iptables); run as root", ErrUnavailable)
	}
	for _, t := range Tools {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("%w: %s is not installed; run scripts/install-deps.sh (make deps)", ErrUnavailable, t)
		}
	}
	probe := Prefix + "probe" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		return fmt.Errorf("%w: ip netns add: %s", ErrUnavailable, strings.TrimSpace(string(out)))
	}
	_ = exec.Command("ip", "netns", "del", probe).Run()
	return nil
}

// Node is one process's namespace.
type Node struct {
	// Name is the process's name ("c1", "b2", "client"...).
	Name string
	// NS is the namespace's name (Prefix + Name).
	NS string
	// IP is the node's address.
	IP string
	// Veth is the name of its veth's bridge end (inside BridgeNS).
	Veth string
}

// Topology is the bridge namespace and one namespace per node.
type Topology struct {
	nodes  []*Node
	byName map[string]*Node
	lock   *os.File
	log    func(string)

	closeOnce sync.Once
	closeErr  error
	stopSig   func()
}

// Create removes what an earlier run left under Prefix, then builds the
// bridge namespace and one namespace per name, with addresses
// Subnet.10, Subnet.11… in order. It waits up to wait for the lock. On
// SIGINT or SIGTERM the topology is closed and the process exits with
// status 130. log receives one line per step (nil: silent).
func Create(ctx context.Context, names []string, wait time.Duration, log func(string)) (*Topology, error) {
	if log == nil {
		log = func(string) {}
	}
	if len(names) > 200 {
		return nil, fmt.Errorf("netns: %d nodes: at most 200", len(names))
	}
	lock, err := acquire(ctx, wait)
	if err != nil {
		return nil, err
	}
	t := &Topology{byName: map[string]*Node{}, lock: lock, log: log}
	if err := cleanStale(log); err != nil {
		t.release()
		return nil, err
	}
	t.trapSignals()
	if err := guard(ctx, true); err != nil {
		_ = t.Close()
		return nil, err
	}
	if err := t.build(ctx, names); err != nil {
		_ = t.Close()
		return nil, err
	}
	return t, nil
}

func acquire(ctx context.Context, wait time.Duration) (*os.File, error) {
	f, err := os.OpenFile(LockFile, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("netns: lock: %w", err)
	}
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("netns: lock %s: %w", LockFile, err)
		}
		if time.Now().After(deadline) {
			f.Close()
			return nil, ErrBusy
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (t *Topology) release() {
	if t.lock != nil {
		_ = unix.Flock(int(t.lock.Fd()), unix.LOCK_UN)
		t.lock.Close()
		t.lock = nil
	}
}

// trapSignals closes the topology on SIGINT/SIGTERM, then exits: the
// processes started with Command die with this process (their parent
// death signal) or are killed by Close.
func (t *Topology) trapSignals() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			t.log(fmt.Sprintf("%v: removing the chaos network and its processes", sig))
			_ = t.Close()
			os.Exit(130)
		case <-done:
		}
	}()
	t.stopSig = func() { signal.Stop(ch); close(done) }
}

func (t *Topology) build(ctx context.Context, names []string) error {
	run := func(args ...string) error { return Run(ctx, "", args...) }
	t.log(fmt.Sprintf("network: bridge namespace %s, %d nodes on %s.0/24", BridgeNS, len(names), Subnet))
	if err := run("ip", "netns", "add", BridgeNS); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"ip", "-n", BridgeNS, "link", "set", "lo", "up"},
		{"ip", "-n", BridgeNS, "link", "add", "br0", "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"ip", "-n", BridgeNS, "link", "set", "br0", "up"},
		// Bridged IPv4 goes through iptables too (br_netfilter), where
		// the NFQUEUE delayer's rules live.
		{"ip", "netns", "exec", BridgeNS, "sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"},
	} {
		if err := run(args...); err != nil {
			return err
		}
	}
	for i, name := range names {
		if _, dup := t.byName[name]; dup || name == "br" || name == "" {
			return fmt.Errorf("netns: node name %q: empty, reserved or repeated", name)
		}
		n := &Node{Name: name, NS: Prefix + name, IP: fmt.Sprintf("%s.%d", Subnet, 10+i), Veth: "wc-" + name}
		if len(n.Veth) > 15 {
			return fmt.Errorf("netns: node name %q: longer than 12 characters", name)
		}
		t.nodes = append(t.nodes, n)
		t.byName[name] = n
		if err := run("ip", "netns", "add", n.NS); err != nil {
			return err
		}
		for _, args := range [][]string{
			{"ip", "-n", BridgeNS, "link", "add", n.Veth, "type", "veth", "peer", "name", "eth0", "netns", n.NS},
			{"ip", "-n", BridgeNS, "link", "set", n.Veth, "master", "br0", "up"},
			{"ip", "-n", n.NS, "addr", "add", n.IP + "/24", "dev", "eth0"},
			{"ip", "-n", n.NS, "link", "set", "eth0", "up"},
			{"ip", "-n", n.NS, "link", "set", "lo", "up"},
		} {
			if err := run(args...); err != nil {
				return err
			}
		}
	}
	return nil
}

// Node returns the node named name, or nil.
func (t *Topology) Node(name string) *Node { return t.byName[name] }

// Nodes returns every node in creation order.
func (t *Topology) Nodes() []*Node { return append([]*Node(nil), t.nodes...) }

// IP returns the address of the node named name ("" when unknown).
func (t *Topology) IP(name string) string {
	if n := t.byName[name]; n != nil {
		return n.IP
	}
	return ""
}

// Command returns a command running argv inside node's namespace (`ip netns
// exec`, which execs argv: the command's pid is argv's). It runs argv
// directly when node is not part of the topology.
func (t *Topology) Command(node string, argv []string) *exec.Cmd {
	n := t.byName[node]
	if n == nil {
		return exec.Command(argv[0], argv[1:]...)
	}
	return exec.Command("ip", append([]string{"netns", "exec", n.NS}, argv...)...)
}

// Dialer returns a dial function whose TCP connections start in node's
// namespace: the socket is created on a thread that joined the namespace,
// and keeps it for its life.
func (t *Topology) Dialer(node string) func(ctx context.Context, addr string) (net.Conn, error) {
	path := "/run/netns/" + Prefix + node
	return func(ctx context.Context, addr string) (net.Conn, error) { return DialIn(ctx, path, addr) }
}

// DialIn dials addr over TCP from the network namespace at nsPath.
func DialIn(ctx context.Context, nsPath, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := dialInLocked(ctx, nsPath, addr)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

func dialInLocked(ctx context.Context, nsPath, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNamespace(nsPath, func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// inNamespace runs f on this goroutine's thread moved into the network
// namespace at nsPath (sockets f creates stay there), then moves the thread
// back. A thread that cannot return stays locked and ends with the
// goroutine, so no other goroutine ever runs in the wrong namespace.
func inNamespace(nsPath string, f func() error) error {
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: own namespace: %w", err)
	}
	defer unix.Close(orig)
	target, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: %s: %w", nsPath, err)
	}
	defer unix.Close(target)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns: enter %s: %w", nsPath, err)
	}
	ferr := f()
	if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
		runtime.UnlockOSThread()
	}
	return ferr
}

// Listener returns a TCP listener on addr inside node's namespace.
func (t *Topology) Listener(node, addr string) (net.Listener, error) {
	return ListenIn("/run/netns/"+Prefix+node, addr)
}

// ListenIn listens on addr (TCP) inside the network namespace at nsPath.
func ListenIn(nsPath, addr string) (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var r result
		r.err = inNamespace(nsPath, func() error {
			var err error
			r.l, err = net.Listen("tcp", addr)
			return err
		})
		ch <- r
	}()
	r := <-ch
	return r.l, r.err
}

// Run runs argv (inside namespace ns unless ns is empty) and returns an
// error carrying its output when it fails.
func Run(ctx context.Context, ns string, argv ...string) error {
	_, err := Output(ctx, ns, argv...)
	return err
}

// Output runs argv like Run and returns its standard output.
func Output(ctx context.Context, ns string, argv ...string) (string, error) {
	return OutputInput(ctx, ns, "", argv...)
}

// RunInput runs argv like Run with input on its standard input (e.g. an
// nft script for `nft -f -`).
func RunInput(ctx context.Context, ns, input string, argv ...string) error {
	_, err := OutputInput(ctx, ns, input, argv...)
	return err
}

// OutputInput runs argv (inside namespace ns unless ns is empty) with input
// on its standard input, bounded to 30s, and returns its standard output.
func OutputInput(ctx context.Context, ns, input string, argv ...string) (string, error) {
	if ns != "" {
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdin = strings.NewReader(input)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("netns: %s: %v: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Close kills every process left in the namespaces, removes them (the
// veths and rules go with them) and releases the lock. It is safe to call
// more than once.
func (t *Topology) Close() error {
	t.closeOnce.Do(func() {
		if t.stopSig != nil {
			t.stopSig()
		}
		var names []string
		for _, n := range t.nodes {
			names = append(names, n.NS)
		}
		names = append(names, BridgeNS)
		t.closeErr = errors.Join(removeNamespaces(names), guard(context.Background(), false))
		t.release()
	})
	return t.closeErr
}

// guardTable is the host namespace's nftables table that rejects packets
// to Subnet: a connection the harness dials by mistake from the host's own
// namespace (not through Dialer) fails at once instead of leaving the
// machine by its default route.
const guardTable = "wchaos_guard"

// guard installs (on) or removes (off) guardTable.
func guard(ctx context.Context, on bool) error {
	if !on {
		if out, err := Output(ctx, "", "nft", "list", "tables", "inet"); err == nil && strings.Contains(out, guardTable) {
			return Run(ctx, "", "nft", "delete", "table", "inet", guardTable)
		}
		return nil
	}
	if err := guard(ctx, false); err != nil {
		return err
	}
	script := fmt.Sprintf(`table inet %s {
	chain output {
		type filter hook output priority 0; policy accept;
		ip daddr %s.0/24 reject
	}
}
`, guardTable, Subnet)
	return RunInput(ctx, "", script, "nft", "-f", "-")
}

// cleanStale removes the namespaces (and their processes) an earlier run
// left under Prefix. The caller holds the lock, so none is in use.
func cleanStale(log func(string)) error {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return fmt.Errorf("netns: ip netns list: %w", err)
	}
	var stale []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], Prefix) {
			stale = append(stale, f[0])
		}
	}
	if len(stale) == 0 {
		return nil
	}
	log(fmt.Sprintf("removing %d namespaces an earlier run left: %s", len(stale), strings.Join(stale, " ")))
	return removeNamespaces(stale)
}

// removeNamespaces kills the processes inside each namespace, waits (5s at
// most) until they are gone, and deletes the namespaces.
func removeNamespaces(names []string) error {
	var pids []int
	for _, ns := range names {
		out, err := exec.Command("ip", "netns", "pids", ns).Output()
		if err != nil {
			continue // already gone
		}
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
				pids = append(pids, pid)
			}
		}
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	var errs []error
	for _, ns := range names {
		if _, err := os.Stat("/run/netns/" + ns); err != nil {
			continue
		}
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("netns: ip netns del %s: %s", ns, strings.TrimSpace(string(out))))
		}
	}
	return errors.Join(errs...)
}
