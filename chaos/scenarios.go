package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"walden/chaos/netfault"
	"walden/internal/devcluster"
	"walden/loadgen"
	waldenv1 "walden/proto/walden/v1"
)

// Scenario is one fault script run on a fresh cluster under load.
type Scenario struct {
	Name        string
	Description string
	// Short marks the scenarios of the short form (`make test`).
	Short bool
	// Automq runs the scenario with AutoMQ-mode brokers, each beside its
	// agent in watchdog mode, and the development AutoMQ controller.
	Automq bool
	// Policy, when set, is the policy the scenario runs under whatever the
	// run's. The AutoMQ scenarios run walden's defaults: a broker that
	// never checks its lease is killed by its watchdog when the lease
	// lapses, and with lease_ttl 1s a loaded host lets healthy brokers'
	// leases lapse (walden's brokers then only refuse appends a moment).
	Policy string
	// Options adjusts the cluster's layout (optional).
	Options func(*devcluster.Options)
	// Setup runs before the cluster starts; undo runs after it stopped
	// (optional).
	Setup func(ctx context.Context, e *Env) (undo func(), err error)
	// Run injects the faults after the warm-up, and heals what it
	// injected before it returns (the harness heals every link again
	// anyway).
	Run func(ctx context.Context, e *Env) error
}

// victim is the broker the broker scenarios act on.
const victim = "b1"

// Catalog lists every scenario in the order a full run takes them.
func Catalog() []Scenario {
	return []Scenario{
		{Name: "kill-broker", Description: "kill -9 a broker under load, restart it after its failover", Run: killBroker},
		{Name: "broker-isolated", Short: true,
			Description: "a broker cut off (both directions) from the coordinators and the other brokers, not from its clients",
			Run:         brokerIsolated},
		{Name: "broker-to-coordinators-cut", Description: "one direction: a broker's packets to the coordinators dropped",
			Run: brokerOneWay},
		{Name: "leader-isolated", Short: true, Description: "the raft leader cut off from the other coordinators under steady load",
			Run: leaderIsolated},
		{Name: "followers-to-leader-cut", Description: "one direction: the followers' packets to the raft leader dropped",
			Run: followersToLeader},
		{Name: "leader-isolated-during-failover", Description: "a broker killed, then the raft leader cut off while the broker is suspected",
			Run: leaderIsolatedDuringFailover},
		{Name: "loss-jitter-leader", Description: "20% loss and 0–100 ms jitter on every packet of the raft leader",
			Run: func(ctx context.Context, e *Env) error { return lossJitter(ctx, e, true) }},
		{Name: "loss-jitter-follower", Short: true, Description: "20% loss and 0–100 ms jitter on every packet of a follower",
			Run: func(ctx context.Context, e *Env) error { return lossJitter(ctx, e, false) }},
		{Name: "broker-flapping", Description: "a broker cut off from the coordinators for 0.6×failure_timeout, back for 0.4×, six times",
			Run: brokerFlapping},
		{Name: "leader-transfer", Description: "the raft leadership handed to another coordinator under load, three times, 5 s apart",
			Run: leaderTransfer},
		{Name: "kill-coordinator", Description: "kill -9 a follower coordinator under load, restart it", Run: killCoordinator},
		{Name: "kill-leader", Description: "kill -9 the raft leader under load, restart it", Run: killLeader},
		{Name: "zombie-broker", Description: "SIGSTOP a broker past its failover, SIGCONT it after", Run: zombieBroker},
		{Name: "pause-follower", Description: "SIGSTOP a follower coordinator under load (a long stall of its process), SIGCONT it; it grants every lease again",
			Run: func(ctx context.Context, e *Env) error { return pauseCoordinator(ctx, e, false) }},
		{Name: "pause-leader", Description: "SIGSTOP the raft leader under load, SIGCONT it once another leads: a stale leader wakes up and grants every lease again",
			Run: func(ctx context.Context, e *Env) error { return pauseCoordinator(ctx, e, true) }},
		{Name: "s3-cut-mid-upload", Description: "a broker killed with 64 MiB of WAL not uploaded; S3 cut off from the recovering coordinator mid-upload",
			Options: backlogOptions, Run: s3CutMidUpload},
		{Name: "disk-full", Description: "the raft leader's data directory full (a small tmpfs) under load, then freed",
			Setup: coordinatorDisks, Run: diskFull},
		{Name: "replace-coordinator", Description: "a follower coordinator killed with its data dir lost, replaced under its name under load; then a broker killed",
			Run: replaceCoordinator},
		{Name: "force-new-cluster", Description: "two coordinators of three lost for good under load; the survivor forced into a new cluster, the others added back empty",
			Run: forceNewCluster},
		{Name: "replace-coordinator-new-name", Description: "a follower coordinator killed with its data dir lost, replaced under a new name on its host under load; then a broker killed",
			Run: replaceCoordinatorNewName},
		{Name: "restore-backup", Description: "a backup taken under load, the whole cluster killed a second later, a new cluster restored from the backup, the brokers started against it; then a broker killed",
			Options: restoreOptions, Run: restoreBackup},
		{Name: "automq-kill-broker", Automq: true, Policy: "default",
			Description: "AutoMQ mode: kill -9 a broker's process under load, its agent alive; its agent starts it again after the failover",
			Run:         automqKillBroker},
		{Name: "automq-broker-cut-from-coordinators", Automq: true, Short: true, Policy: "default",
			Description: "AutoMQ mode: a broker and its agent cut off from the coordinators, not from its clients: the watchdog kills it before any coordinator attests",
			Run:         automqBrokerCutFromCoordinators},
	}
}

// policy is the policy the scenario runs under in a run of policy run.
func (s Scenario) policy(run string) string {
	if s.Policy != "" {
		return s.Policy
	}
	return run
}

// ShortNames are the scenarios of the short form.
func ShortNames() []string {
	var out []string
	for _, s := range Catalog() {
		if s.Short {
			out = append(out, s.Name)
		}
	}
	return out
}

func killBroker(ctx context.Context, e *Env) error {
	b := e.Cluster.Proc(victim)
	e.ExpectFailover(victim, true)
	e.Fault()
	e.Say("kill -9 %s (pid %d)", victim, b.Pid())
	b.Kill()
	if err := e.WaitReopened(ctx, victim, 2*time.Minute); err != nil {
		return err
	}
	return restartBroker(ctx, e, b)
}

func restartBroker(ctx context.Context, e *Env, b *devcluster.Proc) error {
	e.Say("restarting %s", b.Name)
	if err := b.Start(); err != nil {
		return err
	}
	return e.WaitRegistered(ctx, b.Name, 2*time.Minute)
}

func brokerIsolated(ctx context.Context, e *Env) error {
	links := netfault.Both(victim, append(e.Coordinators(), e.Brokers(victim)...)...)
	e.ExpectFailover(victim, true)
	e.Fault()
	e.Say("cutting %s off from the coordinators and the other brokers (its clients still reach it)", victim)
	if err := e.Firewall.Cut(ctx, links...); err != nil {
		return err
	}
	if err := e.WaitReopened(ctx, victim, 2*time.Minute); err != nil {
		return err
	}
	if err := e.Sleep(ctx, 2*time.Second); err != nil {
		return err
	}
	e.Say("healing %s's links", victim)
	if err := e.Firewall.Heal(ctx, links...); err != nil {
		return err
	}
	return e.WaitRegistered(ctx, victim, 2*time.Minute)
}

func brokerOneWay(ctx context.Context, e *Env) error {
	links := netfault.From(victim, e.Coordinators()...)
	e.ExpectFailover(victim, true)
	e.Fault()
	e.Say("dropping %s's packets to the coordinators (theirs to it pass)", victim)
	if err := e.Firewall.Cut(ctx, links...); err != nil {
		return err
	}
	if err := e.WaitReopened(ctx, victim, 2*time.Minute); err != nil {
		return err
	}
	if err := e.Firewall.Heal(ctx, links...); err != nil {
		return err
	}
	return e.WaitRegistered(ctx, victim, 2*time.Minute)
}

func leaderIsolated(ctx context.Context, e *Env) error {
	l, err := e.Leader(ctx)
	if err != nil {
		return err
	}
	links := netfault.Both(l.Name, e.Others(l.Name)...)
	e.Fault()
	e.Say("cutting the leader %s off from %s for %s", l.Name, strings.Join(e.Others(l.Name), ", "), e.Cfg.Cut)
	if err := e.Firewall.Cut(ctx, links...); err != nil {
		return err
	}
	if err := e.Sleep(ctx, e.Cfg.Cut); err != nil {
		return err
	}
	if err := e.Firewall.Heal(ctx, links...); err != nil {
		return err
	}
	nl, err := e.Leader(ctx)
	if err == nil {
		e.Say("leader after the cut: %s", nl.Name)
	}
	return err
}

func followersToLeader(ctx context.Context, e *Env) error {
	l, err := e.Leader(ctx)
	if err != nil {
		return err
	}
	var links []netfault.Link
	for _, f := range e.Others(l.Name) {
		links = append(links, netfault.Link{From: f, To: l.Name})
	}
	e.Fault()
	e.Say("dropping the followers' packets to the leader %s for %s (its packets to them pass)", l.Name, e.Cfg.Cut)
	if err := e.Firewall.Cut(ctx, links...); err != nil {
		return err
	}
	if err := e.Sleep(ctx, e.Cfg.Cut); err != nil {
		return err
	}
	if err := e.Firewall.Heal(ctx, links...); err != nil {
		return err
	}
	_, err = e.Leader(ctx)
	return err
}

func leaderIsolatedDuringFailover(ctx context.Context, e *Env) error {
	b := e.Cluster.Proc(victim)
	e.ExpectFailover(victim, false)
	e.Fault()
	e.Say("kill -9 %s (pid %d)", victim, b.Pid())
	b.Kill()
	if err := e.WaitState(ctx, victim, time.Minute, waldenv1.BrokerState_BROKER_STATE_SUSPECT, waldenv1.BrokerState_BROKER_STATE_FAILED, waldenv1.BrokerState_BROKER_STATE_RECOVERING, waldenv1.BrokerState_BROKER_STATE_RECOVERED); err != nil {
		return err
	}
	if br, err := e.Cluster.GetBroker(ctx, victim); err == nil && br.GetBrokerState() != waldenv1.BrokerState_BROKER_STATE_SUSPECT {
		e.Note("%s was already %s when the leader was cut off", victim, br.GetBrokerState().Name())
	}
	l, err := e.Leader(ctx)
	if err != nil {
		return err
	}
	links := netfault.Both(l.Name, e.Others(l.Name)...)
	e.Say("cutting the leader %s off while %s is suspected", l.Name, victim)
	if err := e.Firewall.Cut(ctx, links...); err != nil {
		return err
	}
	if err := e.WaitReopened(ctx, victim, 2*time.Minute); err != nil {
		return err
	}
	if err := e.Firewall.Heal(ctx, links...); err != nil {
		return err
	}
	return restartBroker(ctx, e, b)
}

func lossJitter(ctx context.Context, e *Env, onLeader bool) error {
	l, err := e.Leader(ctx)
	if err != nil {
		return err
	}
	target, queue := l.Name, uint16(101)
	if !onLeader {
		target, queue = e.Others(l.Name)[0], 102
	}
	if err := e.Firewall.Queue(ctx, target, queue); err != nil {
		return err
	}
	d, err := netfault.StartDelayer(ctx, netfault.DelayerConfig{Queue: queue, Loss: 0.2, Jitter: 100 * time.Millisecond,
		Seed: e.Cfg.Seed, Life: e.Cfg.Hold + time.Minute})
	if err != nil {
		_ = e.Firewall.Unqueue(ctx, target)
		return err
	}
	e.Fault()
	e.Say("20%% loss and 0–100 ms jitter on every packet of %s (leader %s) for %s", target, l.Name, e.Cfg.Hold)
	serr := e.Sleep(ctx, e.Cfg.Hold)
	uerr := e.Firewall.Unqueue(context.Background(), target)
	st := d.Stop()
	e.Note("delayer on %s: %d packets, %d dropped, %d delayed, %d let through at once (queue full)", target, st.Seen, st.Dropped, st.Delayed, st.Overflow)
	if serr != nil {
		return serr
	}
	return uerr
}

func brokerFlapping(ctx context.Context, e *Env) error {
	ft := e.Cfg.FailureTimeout()
	down, up := ft*6/10, ft*4/10
	links := netfault.Both(victim, e.Coordinators()...)
	e.Affect(victim)
	e.Fault()
	for i := 1; i <= 6; i++ {
		e.Say("flap %d/6: %s cut off from the coordinators for %s", i, victim, down)
		if err := e.Firewall.Cut(ctx, links...); err != nil {
			return err
		}
		if err := e.Sleep(ctx, down); err != nil {
			return err
		}
		if err := e.Firewall.Heal(ctx, links...); err != nil {
			return err
		}
		if err := e.Sleep(ctx, up); err != nil {
			return err
		}
	}
	return nil
}

func leaderTransfer(ctx context.Context, e *Env) error {
	e.Fault()
	for i := 1; i <= 3; i++ {
		l, err := e.Leader(ctx)
		if err != nil {
			return err
		}
		to := e.Others(l.Name)[0]
		e.Say("leader transfer %d/3: %s → %s", i, l.Name, to)
		cc, err := e.Cluster.Conn(l.Admin)
		if err != nil {
			return err
		}
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err = waldenv1.NewClusterClient(cc).LeaderTransfer(tctx, &waldenv1.LeaderTransferRequest{Id: to})
		cancel()
		if err != nil {
			return fmt.Errorf("leader transfer %s → %s: %w", l.Name, to, err)
		}
		if err := e.Sleep(ctx, 5*time.Second); err != nil {
			return err
		}
	}
	return nil
}

func killCoordinator(ctx context.Context, e *Env) error {
	l, err := e.Leader(ctx)
	if err != nil {
		return err
	}
	m := e.Cluster.Proc(e.Others(l.Name)[0])
	return killAndRestart(ctx, e, m)
}

func killLeader(ctx context.Context, e *Env) error {
	l, err := e.Leader(ctx)
	if err != nil {
		return err
	}
	return killAndRestart(ctx, e, l)
}

func killAndRestart(ctx context.Context, e *Env, m *devcluster.Proc) error {
	e.Fault()
	e.Say("kill -9 coordinator %s (pid %d) for %s", m.Name, m.Pid(), e.Cfg.Cut)
	m.Kill()
	if err := e.Sleep(ctx, e.Cfg.Cut); err != nil {
		return err
	}
	e.Say("restarting %s", m.Name)
	if err := m.Start(); err != nil {
		return err
	}
	return waitMember(ctx, e, m)
}

// waitMember waits until coordinator m answers and knows the leader.
func waitMember(ctx context.Context, e *Env, m *devcluster.Proc) error {
	return devcluster.Poll(ctx, time.Minute, m.Name+" back with a leader", func() error {
		if !m.Alive() {
			return devcluster.Permanent(fmt.Errorf("%s exited; see %s", m.Name, m.Log))
		}
		st, err := e.Cluster.Status(ctx, m)
		if err != nil {
			return err
		}
		if st.GetLeaderId() == "" {
			return fmt.Errorf("%s knows no leader", m.Name)
		}
		return nil
	})
}

// pauseCoordinator stops a coordinator's process (SIGSTOP: a stall as
// long as a VM's or a garbage collector's worst, memory and sockets kept)
// for Cut, then lets it go on. Nothing may fail over and no healthy lease
// may lapse: the other two grant every lease meanwhile. Woken, the member
// finds every broker silent for longer than failure_timeout by its own
// clock, and a leader finds its term over; it must catch up, and grant
// every lease again — an attestation it made on waking is withdrawn once
// the broker is heard again.
func pauseCoordinator(ctx context.Context, e *Env, leader bool) error {
	l, err := e.Leader(ctx)
	if err != nil {
		return err
	}
	m := l
	if !leader {
		m = e.Cluster.Proc(e.Others(l.Name)[0])
	}
	e.Fault()
	e.Say("SIGSTOP coordinator %s (pid %d, leader %s) for %s", m.Name, m.Pid(), l.Name, e.Cfg.Cut)
	if err := m.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	serr := e.Sleep(ctx, e.Cfg.Cut)
	e.Say("SIGCONT %s", m.Name)
	if err := m.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	if err := waitMember(ctx, e, m); err != nil {
		return err
	}
	return waitGranting(ctx, e, m.Name)
}

// waitGranting watches coordinator name for twice failure_timeout after it
// went on, noting the leases it attests expired meanwhile, then waits
// until it attests none of the brokers' current leases: it grants every
// lease again.
func waitGranting(ctx context.Context, e *Env, name string) error {
	start := time.Now()
	attested := map[string]bool{}
	var last error
	attesting := func() error {
		var held []string
		for _, b := range e.Brokers("") {
			br, err := e.Cluster.GetBroker(ctx, b)
			if err != nil {
				return err
			}
			for _, o := range br.GetObservations() {
				if o.GetObserverId() == name && o.GetEpoch() == br.GetEpoch() && o.GetLeaseExpired() {
					held = append(held, b)
					attested[b] = true
				}
			}
		}
		if len(held) > 0 {
			return fmt.Errorf("%s still attests the leases of %s expired", name, strings.Join(held, ", "))
		}
		return nil
	}
	for end := start.Add(2 * e.Cfg.FailureTimeout()); time.Now().Before(end); {
		last = attesting()
		if err := e.Sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	if last != nil {
		last = devcluster.Poll(ctx, 2*time.Minute, name+" granting every lease again", attesting)
	}
	if last != nil {
		return last
	}
	if len(attested) == 0 {
		e.Note("%s attested no lease expired after it went on", name)
	} else {
		e.Note("%s attested %d leases expired after it went on, and grants every one again %.1f s after it went on",
			name, len(attested), time.Since(start).Seconds())
	}
	return nil
}

func zombieBroker(ctx context.Context, e *Env) error {
	b := e.Cluster.Proc(victim)
	e.ExpectFailover(victim, true)
	e.Fault()
	e.Say("SIGSTOP %s (pid %d)", victim, b.Pid())
	if err := b.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	if err := e.WaitReopened(ctx, victim, 2*time.Minute); err != nil {
		_ = b.Signal(syscall.SIGCONT)
		return err
	}
	e.Say("SIGCONT %s after its failover", victim)
	if err := b.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	return e.WaitRegistered(ctx, victim, 2*time.Minute)
}

const backlogBytes = 64 << 20

func backlogOptions(o *devcluster.Options) {
	o.BacklogStreams = true
	o.WALCapacity = 2*backlogBytes + 64<<20
	o.UploadBytes, o.UploadInterval = o.WALCapacity/2, time.Hour
	// One upload at a time, in small parts: the upload step lasts.
	o.Recovery = append(o.Recovery, "upload_concurrency: 1", "part_size: 5242880")
}

func s3CutMidUpload(ctx context.Context, e *Env) error {
	b := e.Cluster.Proc(victim)
	const payload = 16 << 10
	n := int64(backlogBytes / payload)
	e.Say("backlog: %d records of %d bytes to %s's stream %d, kept in its WAL", n, payload, victim, b.BacklogStream)
	_, err := loadgen.Load(ctx, loadgen.LoadConfig{Coordinators: e.Cluster.AdminAddrs(), Streams: []uint64{b.BacklogStream},
		Rate: 1e6, Duration: 5 * time.Minute, MaxRecords: n, PayloadBytes: payload, MaxBatch: 64,
		Ledger: filepath.Join(e.Cluster.Opts.Dir, "ledger-backlog.jsonl"), DialOptions: e.Cluster.DialOptions()})
	if err != nil {
		return fmt.Errorf("backlog: %w", err)
	}
	e.ExpectFailover(victim, false)
	e.Fault()
	e.Say("kill -9 %s (pid %d)", victim, b.Pid())
	b.Kill()
	var assignee string
	err = devcluster.Poll(ctx, 2*time.Minute, "the recovery of "+victim+" in its upload step", func() error {
		jobs, err := e.Cluster.ListJobs(ctx, victim)
		if err != nil || len(jobs) == 0 {
			return fmt.Errorf("no job yet")
		}
		j := jobs[len(jobs)-1]
		switch {
		case j.GetJobState() == waldenv1.JobState_JOB_STATE_RUNNING && j.GetJobStep() == waldenv1.JobStep_JOB_STEP_UPLOAD && j.GetAssigneeId() != "":
			assignee = j.GetAssigneeId()
			return nil
		case j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED || j.GetJobState() == waldenv1.JobState_JOB_STATE_FAILED:
			return devcluster.Permanent(fmt.Errorf("job %s %s before its upload could be cut", j.GetJobId(), j.GetJobState().Name()))
		}
		return fmt.Errorf("job %s %s step %s", j.GetJobId(), j.GetJobState().Name(), j.GetJobStep().Name())
	})
	if err != nil {
		return err
	}
	links := netfault.Both(assignee, "s3")
	e.Say("cutting S3 off from %s, executing the recovery, for %s", assignee, e.Cfg.Cut)
	if err := e.Firewall.Cut(ctx, links...); err != nil {
		return err
	}
	if err := e.Sleep(ctx, e.Cfg.Cut); err != nil {
		return err
	}
	if err := e.Firewall.Heal(ctx, links...); err != nil {
		return err
	}
	if err := e.WaitReopened(ctx, victim, 3*time.Minute); err != nil {
		return err
	}
	if jobs, err := e.Cluster.ListJobs(ctx, victim); err == nil && len(jobs) > 0 {
		j := jobs[len(jobs)-1]
		e.Note("job %s %s on %s at attempt %d (S3 was cut from %s)", j.GetJobId(), j.GetJobState().Name(), j.GetAssigneeId(), j.GetAttempt(), assignee)
	}
	return restartBroker(ctx, e, b)
}

// diskSource names the harness's tmpfs mounts (the first column of
// /proc/mounts), so that a later run finds the ones a killed run left.
const diskSource = "wchaos-disk"

// coordinatorDisks puts every coordinator's data directory on a 256 MiB
// tmpfs of its own.
func coordinatorDisks(ctx context.Context, e *Env) (func(), error) {
	var mounted []string
	undo := func() {
		for _, p := range mounted {
			_ = unix.Unmount(p, unix.MNT_DETACH)
		}
	}
	for _, m := range e.Cluster.Coords {
		dir := filepath.Join(e.Cluster.Opts.Dir, m.Name) // the member's data_dir: its owner's only
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return undo, err
		}
		if err := unix.Mount(diskSource, dir, "tmpfs", 0, "size=256m,mode=0700"); err != nil {
			return undo, fmt.Errorf("mount a tmpfs on %s: %w", dir, err)
		}
		mounted = append(mounted, dir)
	}
	return undo, nil
}

func diskFull(ctx context.Context, e *Env) error {
	l, err := e.Leader(ctx)
	if err != nil {
		return err
	}
	dir := filepath.Join(e.Cluster.Opts.Dir, l.Name)
	fill := filepath.Join(dir, "fill")
	f, err := os.Create(fill)
	if err != nil {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		f.Close()
		return err
	}
	free := int64(st.Bavail) * st.Bsize
	e.Fault()
	e.Say("filling %s's data directory (%s free) for %s", l.Name, devcluster.FormatBytes(uint64(free)), e.Cfg.Cut)
	if err := unix.Fallocate(int(f.Fd()), 0, 0, free); err != nil {
		f.Close()
		return fmt.Errorf("fill %s: %w", dir, err)
	}
	f.Close()
	serr := e.Sleep(ctx, e.Cfg.Cut)
	if err := os.Remove(fill); err != nil {
		return err
	}
	if serr != nil {
		return serr
	}
	if !l.Alive() {
		e.Note("%s exited while its disk was full (see %s); restarted", l.Name, l.Log)
		if err := l.Start(); err != nil {
			return err
		}
	}
	return waitMember(ctx, e, l)
}

// unmountStale unmounts the tmpfs mounts a killed run left.
func unmountStale() error {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == diskSource {
			if err := unix.Unmount(f[1], unix.MNT_DETACH); err != nil {
				return fmt.Errorf("chaos: unmount %s: %w", f[1], err)
			}
		}
	}
	return nil
}

func decodeJSON(resp *http.Response, v any) error {
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(v)
}

// addBack adds coordinator m again with an empty data dir, as the
// runbook's replacement does: it is added as a learner (retried while the
// spacing of voter changes refuses), started with initial_cluster_state:
// existing, and waited for until it is a voter.
func addBack(ctx context.Context, e *Env, m *devcluster.Proc) error {
	if err := os.RemoveAll(filepath.Join(e.Cluster.Opts.Dir, m.Name)); err != nil {
		return err
	}
	if err := addMember(ctx, e, m); err != nil {
		return err
	}
	f, err := os.OpenFile(m.Config, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, werr := f.WriteString("initial_cluster_state: existing\n")
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return werr
	}
	return startVoter(ctx, e, m)
}

// addMember adds m as a learner, retried while the spacing of voter
// changes refuses.
func addMember(ctx context.Context, e *Env, m *devcluster.Proc) error {
	return devcluster.Poll(ctx, time.Minute, "the addition of "+m.Name, func() error {
		err := e.Cluster.Call(ctx, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := waldenv1.NewClusterClient(cc).MemberAdd(ctx, &waldenv1.MemberAddRequest{Id: m.Name, RaftAddr: m.Raft, AdminAddr: m.Admin})
			return err
		})
		if status.Code(err) == codes.AlreadyExists {
			return nil
		}
		return err
	})
}

// startVoter starts m (with an empty data dir) and waits until the leader
// has promoted it to voter.
func startVoter(ctx context.Context, e *Env, m *devcluster.Proc) error {
	e.Say("starting %s with an empty data dir", m.Name)
	if err := m.Start(); err != nil {
		return err
	}
	start := time.Now()
	err := devcluster.Poll(ctx, 2*time.Minute, m.Name+" a voter", func() error {
		if !m.Alive() {
			return devcluster.Permanent(fmt.Errorf("%s exited; see %s", m.Name, m.Log))
		}
		// The leader's configuration: the replacement's own shows its old
		// membership while it replays the log.
		l, err := e.Cluster.WaitLeader(ctx, "", 5*time.Second)
		if err != nil {
			return err
		}
		st, err := e.Cluster.Status(ctx, l)
		if err != nil {
			return err
		}
		for _, mm := range st.GetMembers() {
			if mm.GetId() == m.Name && mm.GetMemberRole() != waldenv1.MemberRole_MEMBER_ROLE_LEARNER && st.GetLeaderId() != "" {
				return nil
			}
		}
		return fmt.Errorf("%s not a voter yet", m.Name)
	})
	if err == nil {
		e.Note("%s added back with an empty data dir; a voter %.1fs after it started", m.Name, time.Since(start).Seconds())
	}
	return err
}

// forceNewCluster is the runbook's way out of a lost quorum, under load:
// the leader and a follower are killed for good (their data dirs lost);
// the survivor is stopped and started once with --force-new-cluster, leads
// alone (every broker's epoch revoked: the brokers register again), and the
// two others are added back with empty data dirs.
func forceNewCluster(ctx context.Context, e *Env) error {
	l, err := e.Leader(ctx)
	if err != nil {
		return err
	}
	others := e.Others(l.Name)
	lost, survivor := []*devcluster.Proc{l, e.Cluster.Proc(others[0])}, e.Cluster.Proc(others[1])
	for _, b := range e.Brokers("") {
		e.ExpectFailover(b, false) // --force-new-cluster revokes every broker's epoch
	}
	e.Fault()
	for _, m := range lost {
		e.Say("kill -9 coordinator %s (pid %d): lost for good", m.Name, m.Pid())
		m.Kill()
	}
	if err := e.Sleep(ctx, 3*time.Second); err != nil {
		return err
	}
	e.Say("stopping the survivor %s and starting it with --force-new-cluster", survivor.Name)
	if err := survivor.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	if err := devcluster.Poll(ctx, 30*time.Second, survivor.Name+" stopped", func() error {
		if survivor.Alive() {
			return fmt.Errorf("%s still running", survivor.Name)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := survivor.StartWith("--force-new-cluster"); err != nil {
		return err
	}
	if _, err := e.Cluster.WaitLeader(ctx, "", time.Minute); err != nil {
		return err
	}
	for _, m := range lost {
		if err := addBack(ctx, e, m); err != nil {
			return err
		}
	}
	for _, b := range e.Brokers("") {
		if err := e.WaitRegistered(ctx, b, 2*time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// replaceCoordinator is the runbook's replacement of a member whose disk is
// lost, under its name, under load: a follower is killed and its data dir
// lost; it is removed and added again as a learner (waldenctl member
// replace does both), started with an empty data dir and
// initial_cluster_state: existing, and promoted by the leader once the
// spacing of voter changes allows. Then a broker is killed: its failover,
// decided by a cluster that includes the replacement, is judged against the
// reopen goal.
func replaceCoordinator(ctx context.Context, e *Env) error {
	l, err := e.Leader(ctx)
	if err != nil {
		return err
	}
	m := e.Cluster.Proc(e.Others(l.Name)[0])
	e.Say("kill -9 coordinator %s (pid %d) and lose its data dir", m.Name, m.Pid())
	m.Kill()
	e.Say("replacing %s under its name: remove, add as a learner", m.Name)
	if err := removeMember(ctx, e, m.Name); err != nil {
		return err
	}
	if err := addBack(ctx, e, m); err != nil {
		return err
	}
	return killVictimAfterReplacement(ctx, e)
}

// removeMember removes member name, retried while the spacing of voter
// changes refuses.
func removeMember(ctx context.Context, e *Env, name string) error {
	removed := false
	return devcluster.Poll(ctx, time.Minute, "the removal of "+name, func() error {
		if removed {
			return nil
		}
		err := e.Cluster.Call(ctx, func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := waldenv1.NewClusterClient(cc).MemberRemove(ctx, &waldenv1.MemberRemoveRequest{Id: name})
			return err
		})
		if err == nil || status.Code(err) == codes.NotFound {
			removed = true
			return nil
		}
		return err // VOTER_CHANGE_TOO_SOON right after a start: wait and retry
	})
}

// killVictimAfterReplacement kills the victim broker once the replacement
// has waited out its lease horizon: its failover, decided by a cluster
// that includes the replacement, is judged against the goals.
func killVictimAfterReplacement(ctx context.Context, e *Env) error {
	// The replacement grants nothing for a lease horizon after its start;
	// give it that before the broker's failover is judged.
	if err := e.Sleep(ctx, 5*time.Second); err != nil {
		return err
	}
	b := e.Cluster.Proc(victim)
	e.ExpectFailover(victim, true)
	e.Fault()
	e.Say("kill -9 %s (pid %d)", victim, b.Pid())
	b.Kill()
	if err := e.WaitReopened(ctx, victim, 2*time.Minute); err != nil {
		return err
	}
	return restartBroker(ctx, e, b)
}

// replaceCoordinatorNewName is the runbook's replacement of a member whose
// disk is lost under a new name, under load: a follower is killed and its
// data dir lost; it is removed and its replacement c4 added as a learner
// on its host and addresses (waldenctl member replace c2 --name c4 --raft
// ... --admin ...), started with an empty data dir and
// initial_cluster_state: existing, and promoted once the spacing of voter
// changes allows. Then a broker is killed and judged against the goals.
func replaceCoordinatorNewName(ctx context.Context, e *Env) error {
	l, err := e.Leader(ctx)
	if err != nil {
		return err
	}
	m := e.Cluster.Proc(e.Others(l.Name)[0])
	e.Say("kill -9 coordinator %s (pid %d) and lose its data dir", m.Name, m.Pid())
	m.Kill()
	if err := os.RemoveAll(filepath.Join(e.Cluster.Opts.Dir, m.Name)); err != nil {
		return err
	}
	const name = "c4"
	e.Say("replacing %s under the new name %s on its host: remove, add %s as a learner", m.Name, name, name)
	if err := removeMember(ctx, e, m.Name); err != nil {
		return err
	}
	n, err := e.Cluster.ReplaceCoordinator(m.Name, name)
	if err != nil {
		return err
	}
	if err := addMember(ctx, e, n); err != nil {
		return err
	}
	if err := startVoter(ctx, e, n); err != nil {
		return err
	}
	return killVictimAfterReplacement(ctx, e)
}

// restoreOptions: the brokers upload every 300 ms, so that objects are
// written after the backup, beside records only the WALs hold.
func restoreOptions(o *devcluster.Options) { o.UploadInterval = 300 * time.Millisecond }

// restoreBackup is the runbook's restore of a cluster from a backup, under
// load: a backup is saved (waldenctl snapshot save), the cluster goes on
// for a second and then stops — every coordinator and broker killed — and
// a new cluster is restored from the backup under a new name (walden
// snapshot restore on each member, on the same hosts, with empty data
// dirs); the coordinators are started, then the brokers against the new
// cluster. Until the restored cluster has reconciled its catalog with the
// objects in S3 and the brokers' WALs, no broker registers and no stream
// opens; the load resumes after. Then a broker is killed and judged
// against the goals.
func restoreBackup(ctx context.Context, e *Env) error {
	c := e.Cluster
	for _, b := range e.Brokers("") {
		e.Affect(b) // the stop lapses every broker's lease
	}
	file := filepath.Join(c.Opts.Dir, "backup.snap")
	snap, err := c.SaveSnapshot(ctx, file)
	if err != nil {
		return err
	}
	e.Say("backup saved: index %d, %d streams, %d objects", snap.Header.GetIndex(), snap.Header.GetStreams(), snap.Header.GetObjects())
	if err := e.Sleep(ctx, time.Second); err != nil {
		return err
	}
	e.Say("the cluster stops: kill -9 every broker and coordinator")
	for _, p := range append(append([]*devcluster.Proc{}, c.Brokers...), c.Coords...) {
		p.Kill()
	}
	name := c.Opts.ClusterName + "-restored"
	outs, err := c.RestoreInto(ctx, file, name)
	if err != nil {
		return err
	}
	for _, o := range outs {
		e.Say("%s", o)
	}
	start := time.Now()
	for _, m := range c.Coords {
		if err := m.Start(); err != nil {
			return err
		}
	}
	if _, err := c.WaitLeader(ctx, "", time.Minute); err != nil {
		return err
	}
	e.Say("starting the brokers against %s", name)
	for _, b := range c.Brokers {
		if err := b.Start(); err != nil {
			return err
		}
	}
	rs, err := c.WaitReconciled(ctx, 3*time.Minute, func(s string) { e.Say("%s", s) })
	if err != nil {
		return err
	}
	rep := rs.GetReport()
	e.Note("restored from the backup at index %d and reconciled %.1fs after the start: %d of %d keys written after the backup committed again "+
		"(%d ranges, %d streams extended), %d stream tails from the WALs, %d redundant, %d superseded, %d damaged, %d gaps",
		snap.Header.GetIndex(), time.Since(start).Seconds(), rep.GetObjectsCommitted(), rep.GetObjectsListed()-rep.GetObjectsKnown()-rep.GetObjectsOlder(),
		rep.GetRangesCommitted(), rep.GetStreamsExtended(), rep.GetTails(), rep.GetObjectsRedundant(), rep.GetObjectsSuperseded(),
		len(rep.GetDamaged()), len(rep.GetGaps()))
	if len(rep.GetDamaged()) > 0 || len(rep.GetGaps()) > 0 {
		return fmt.Errorf("the reconciliation found damaged objects or gaps: %v", rep)
	}
	for _, b := range e.Brokers("") {
		if err := e.WaitRegistered(ctx, b, 2*time.Minute); err != nil {
			return err
		}
	}
	if err := c.WaitStreamsOpen(ctx, 2*time.Minute); err != nil {
		return err
	}
	e.Note("every stream open again %.1fs after the restored cluster's start", time.Since(start).Seconds())
	if err := e.Sleep(ctx, 3*time.Second); err != nil {
		return err
	}
	// The brokers took the streams over as they registered: the victim is
	// the one that owns the most.
	var b *devcluster.Proc
	var owned []uint64
	for _, name := range e.Brokers("") {
		o, err := e.Owned(ctx, name)
		if err != nil {
			return err
		}
		if len(o) > len(owned) {
			b, owned = c.Proc(name), o
		}
	}
	if b == nil {
		return errors.New("no broker owns a stream after the restore")
	}
	e.ExpectFailoverOf(b.Name, owned, true)
	e.Fault()
	e.Say("kill -9 %s (pid %d), which owns streams %v", b.Name, b.Pid(), owned)
	b.Kill()
	if err := e.WaitStreamsReopened(ctx, b.Name, owned, 2*time.Minute); err != nil {
		return err
	}
	return restartBroker(ctx, e, b)
}
