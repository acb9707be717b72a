package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	waldenv1 "walden/proto/walden/v1"
)

// devOptions are the flags of `walden dev`.
type devOptions struct {
	dir     string
	keep    bool
	output  string
	timeout time.Duration
}

func init() {
	var o devOptions
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the demonstration: a 3-member cluster on loopback, kill its leader, watch it recover",
		Long: `dev starts three coordinators (walden server) as child processes on 127.0.0.1,
waits for a leader, kills the leader with SIGKILL, measures how long the
survivors take to elect a new one, restarts the killed member from its data
directory and waits until it has caught up. It ends with a summary.

--keep leaves the cluster running (until Ctrl-C) and prints how to reach it
with waldenctl.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDev(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&o.dir, "dir", "", "working directory for configs, data and logs (default: a new temporary directory)")
	cmd.Flags().BoolVar(&o.keep, "keep", false, "leave the cluster running after the demonstration")
	cmd.Flags().StringVarP(&o.output, "output", "o", "table", "summary format: table or json")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 60*time.Second, "give up when a step takes longer than this")
	rootCmd.AddCommand(cmd)
}

// devMember is one coordinator child process.
type devMember struct {
	id, admin, raft, gossip, http string
	config, logFile               string
	cmd                           *exec.Cmd
	exited                        chan struct{}
}

// devSummary is what `walden dev` reports at the end.
type devSummary struct {
	ClusterName       string `json:"cluster_name"`
	Dir               string `json:"dir"`
	FirstLeader       string `json:"first_leader"`
	FirstElectionMS   int64  `json:"first_election_ms"`
	KilledLeader      string `json:"killed_leader"`
	NewLeader         string `json:"new_leader"`
	FailoverMS        int64  `json:"failover_ms"`
	RejoinMS          int64  `json:"rejoin_ms"`
	FinalTerm         uint64 `json:"final_term"`
	FinalAppliedIndex uint64 `json:"final_applied_index"`
}

func runDev(ctx context.Context, o devOptions, out io.Writer) error {
	if o.output != "table" && o.output != "json" {
		return fmt.Errorf("dev: -o: must be table or json, not %q", o.output)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	say := func(format string, args ...any) {
		if o.output == "table" {
			fmt.Fprintf(out, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
		}
	}

	dir := o.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "walden-dev-")
		if err != nil {
			return fmt.Errorf("dev: %w", err)
		}
		dir = d
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("dev: find own binary: %w", err)
	}
	members, err := devLayout(dir)
	if err != nil {
		return err
	}
	defer func() {
		if !o.keep {
			for _, m := range members {
				m.kill()
			}
		}
	}()

	sum := devSummary{ClusterName: "dev", Dir: dir}
	say("starting 3 coordinators in %s", dir)
	start := time.Now()
	for _, m := range members {
		if err := m.start(exe); err != nil {
			return err
		}
		say("  %s  admin %s  raft %s  log %s", m.id, m.admin, m.raft, m.logFile)
	}
	leader, st, err := devWaitLeader(ctx, members, "", o.timeout)
	if err != nil {
		return err
	}
	sum.FirstLeader, sum.FirstElectionMS = leader, time.Since(start).Milliseconds()
	say("leader elected: %s (term %d) after %d ms", leader, st.GetTerm(), sum.FirstElectionMS)
	if o.output == "table" {
		devPrintStatus(out, st)
	}

	victim := devFind(members, leader)
	say("killing the leader %s with SIGKILL", victim.id)
	killed := time.Now()
	victim.kill()
	sum.KilledLeader = victim.id
	newLeader, st, err := devWaitLeader(ctx, members, victim.id, o.timeout)
	if err != nil {
		return err
	}
	sum.NewLeader, sum.FailoverMS = newLeader, time.Since(killed).Milliseconds()
	say("new leader: %s (term %d) %d ms after the kill", newLeader, st.GetTerm(), sum.FailoverMS)

	say("restarting %s from its data directory", victim.id)
	restarted := time.Now()
	if err := victim.start(exe); err != nil {
		return err
	}
	st, err = devWaitCaughtUp(ctx, victim, st.GetCommitIndex(), o.timeout)
	if err != nil {
		return err
	}
	sum.RejoinMS = time.Since(restarted).Milliseconds()
	say("%s rejoined and caught up to index %d in %d ms", victim.id, st.GetAppliedIndex(), sum.RejoinMS)
	// The leader's view has every member's match index and reachability.
	if _, lst, err := devWaitLeader(ctx, members, "", o.timeout); err == nil {
		st = lst
	}
	sum.FinalTerm, sum.FinalAppliedIndex = st.GetTerm(), st.GetAppliedIndex()

	if o.output == "json" {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sum); err != nil {
			return err
		}
	} else {
		devPrintStatus(out, st)
		fmt.Fprintf(out, "\nsummary: first election %d ms; leader %s killed, %s elected after %d ms; %s rejoined in %d ms\n",
			sum.FirstElectionMS, sum.KilledLeader, sum.NewLeader, sum.FailoverMS, sum.KilledLeader, sum.RejoinMS)
	}
	if !o.keep {
		return nil
	}
	var eps []string
	for _, m := range members {
		eps = append(eps, m.admin)
	}
	fmt.Fprintf(out, "\nthe cluster keeps running (Ctrl-C stops it). Try:\n  waldenctl --endpoints %s status\n  waldenctl --endpoints %s member list -o json\n",
		strings.Join(eps, ","), strings.Join(eps, ","))
	<-ctx.Done()
	for _, m := range members {
		m.kill()
	}
	return nil
}

// devLayout picks free loopback ports and writes one config file per member.
func devLayout(dir string) ([]*devMember, error) {
	var members []*devMember
	for i := 1; i <= 3; i++ {
		m := &devMember{id: fmt.Sprintf("c%d", i)}
		for _, p := range []*string{&m.admin, &m.raft, &m.gossip, &m.http} {
			addr, err := freeLoopbackAddr()
			if err != nil {
				return nil, fmt.Errorf("dev: pick a port: %w", err)
			}
			*p = addr
		}
		members = append(members, m)
	}
	var peers strings.Builder
	for _, m := range members {
		fmt.Fprintf(&peers, "  - {id: %s, raft: %q, admin: %q}\n", m.id, m.raft, m.admin)
	}
	for _, m := range members {
		m.config = filepath.Join(dir, m.id+".yaml")
		m.logFile = filepath.Join(dir, m.id+".log")
		text := fmt.Sprintf(`cluster_name: dev
node_id: %s
data_dir: %q
listen:
  admin: %q
  raft: %q
  gossip: %q
  http: %q
initial_cluster:
%slog: {level: info, format: json}
`, m.id, filepath.Join(dir, m.id), m.admin, m.raft, m.gossip, m.http, peers.String())
		if err := os.WriteFile(m.config, []byte(text), 0o644); err != nil {
			return nil, fmt.Errorf("dev: %w", err)
		}
	}
	return members, nil
}

func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func (m *devMember) start(exe string) error {
	logf, err := os.OpenFile(m.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("dev: %w", err)
	}
	m.cmd = exec.Command(exe, "server", "--config", m.config)
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	dieWithParent(m.cmd)
	if err := m.cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("dev: start %s: %w", m.id, err)
	}
	m.exited = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) {
		_ = c.Wait()
		logf.Close()
		close(done)
	}(m.cmd, m.exited)
	return nil
}

func (m *devMember) kill() {
	if m.cmd == nil || m.cmd.Process == nil {
		return
	}
	select {
	case <-m.exited:
		return
	default:
	}
	_ = m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.exited
}

func (m *devMember) alive() bool {
	if m.exited == nil {
		return false
	}
	select {
	case <-m.exited:
		return false
	default:
		return true
	}
}

func devFind(members []*devMember, id string) *devMember {
	for _, m := range members {
		if m.id == id {
			return m
		}
	}
	return nil
}

// devStatus asks one member for its status.
func devStatus(ctx context.Context, addr string) (*waldenv1.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return waldenv1.NewClusterClient(conn).Status(ctx, &waldenv1.StatusRequest{})
}

// devWaitLeader polls the live members until one of them reports a leader
// other than exclude, and that leader itself agrees.
func devWaitLeader(ctx context.Context, members []*devMember, exclude string, timeout time.Duration) (string, *waldenv1.StatusResponse, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, m := range members {
			if !m.alive() {
				continue
			}
			st, err := devStatus(ctx, m.admin)
			if err != nil || st.GetLeaderId() == "" || st.GetLeaderId() == exclude {
				continue
			}
			if st.GetLeaderId() == m.id {
				return m.id, st, nil
			}
		}
		if err := devSleep(ctx, 100*time.Millisecond); err != nil {
			return "", nil, err
		}
	}
	for _, m := range members {
		if m.id != exclude && !m.alive() {
			return "", nil, fmt.Errorf("dev: no leader after %s; %s exited, see %s", timeout, m.id, m.logFile)
		}
	}
	return "", nil, fmt.Errorf("dev: no leader after %s; see the logs in %s", timeout, filepath.Dir(members[0].logFile))
}

// devWaitCaughtUp polls m until it knows a leader and has applied index.
func devWaitCaughtUp(ctx context.Context, m *devMember, index uint64, timeout time.Duration) (*waldenv1.StatusResponse, error) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !m.alive() {
			return nil, fmt.Errorf("dev: %s exited after restart; see %s", m.id, m.logFile)
		}
		st, err := devStatus(ctx, m.admin)
		if err == nil && st.GetLeaderId() != "" && st.GetAppliedIndex() >= index {
			return st, nil
		}
		if err := devSleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("dev: %s did not catch up to index %d within %s; see %s", m.id, index, timeout, m.logFile)
}

func devSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return errors.New("dev: interrupted")
	case <-t.C:
		return nil
	}
}

func devPrintStatus(out io.Writer, st *waldenv1.StatusResponse) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  ID\tROLE\tRAFT\tADMIN\tREACHABLE\tMATCH")
	for _, m := range st.GetMembers() {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%v\t%d\n", m.GetId(), m.GetRole(), m.GetRaftAddr(), m.GetAdminAddr(), m.GetReachable(), m.GetMatchIndex())
	}
	tw.Flush()
}
