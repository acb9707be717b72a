package devcluster

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"walden/loadgen"
	waldenv1 "walden/proto/walden/v1"
)

// Failover is the `walden dev` scenario: load on every stream, an optional
// backlog of un-uploaded WAL on the victim, a SIGKILL of the victim after a
// warm-up, the failover watched live until the victim's streams are open on
// other brokers, more load, then verify.
type Failover struct {
	// Victim is the broker to kill (default the first broker).
	Victim string
	// Rate is the load in records per second over all streams (default 300).
	Rate float64
	// Payload is the record size in bytes (default 64).
	Payload int
	// Warmup is the load before the kill (default 5s).
	Warmup time.Duration
	// Backlog is the amount of un-uploaded WAL (record payload bytes) the
	// victim holds at the kill: extra records of BacklogPayload bytes are
	// appended to the victim's backlog stream before the kill. The cluster
	// must then have BacklogStreams and an upload_interval and upload_bytes
	// that keep them in the WAL. 0: none beyond what the warm-up leaves.
	Backlog int64
	// BacklogPayload is the record size of the backlog (default 16 KiB).
	BacklogPayload int
	// After is the load after the victim's streams reopened (default 2s).
	After time.Duration
	// Timeout bounds each wait (default 60s).
	Timeout time.Duration
	// Say receives one line per change seen (nil: silent).
	Say func(line string)
	// BeforeKill runs after the warm-up, before the kill (optional).
	BeforeKill func(ctx context.Context) error
	// Signal is what the victim is sent (default SIGKILL; SIGSTOP makes it
	// a zombie that the cluster fails over while it still exists).
	Signal syscall.Signal
	// AfterFailover runs once the failover is done, before the load after
	// it (optional).
	AfterFailover func(ctx context.Context) error
	// AfterKill runs right after the kill, before the wait for the
	// failover (optional), e.g. to kill the raft leader while the
	// coordinators suspect the victim.
	AfterKill func(ctx context.Context) error
	// DuringRecovery is called with the victim's recovery job at every poll
	// until it returns done (optional), e.g. to kill the job's assignee in
	// the upload step.
	DuringRecovery func(ctx context.Context, job *waldenv1.Job) (done bool, err error)
}

// StreamSummary is one stream's outcome.
type StreamSummary struct {
	Stream           uint64   `json:"stream"`
	Acked            int64    `json:"acked"`
	MaxUnavailableMs int64    `json:"max_unavailable_ms"`
	Owners           []string `json:"owners"`
}

// Summary is the outcome of a Failover run. Times are measured from the
// moment the victim was sent SIGKILL: detection from the FAILED decision's
// commit time (the broker's failed_unix_ms, same host clock), recovery
// until the recovery job finished (every stream of the victim closed), reopen
// until every such stream was seen OPENED by another broker.
type Summary struct {
	// Policy names the failover policy (set by the caller).
	Policy     string `json:"policy"`
	Victim     string `json:"victim"`
	Acked      int64  `json:"acked"`
	Present    int64  `json:"present"`
	Lost       int64  `json:"lost"`
	Gaps       int64  `json:"gaps"`
	Duplicates int64  `json:"duplicates"`
	// DuplicateAcks counts records of retried appends that a broker
	// answered as already stored (the producers are idempotent).
	DuplicateAcks int64 `json:"duplicate_acks"`
	DetectionMs   int64 `json:"detection_ms"`
	RecoveryMs    int64 `json:"recovery_ms"`
	ReopenMs      int64 `json:"reopen_ms"`
	// ReopenAfterCloseMs is reopen minus recovery from the catalog's own
	// times (the recovery job's close step done → the last of its streams
	// open on another broker), in milliseconds: ReopenMs − RecoveryMs is
	// only as precise as the 100 ms polling of the scenario.
	ReopenAfterCloseMs  int64 `json:"reopen_after_close_ms"`
	MaxUnavailableMs    int64 `json:"max_unavailable_ms"`
	MedianUnavailableMs int64 `json:"median_unavailable_ms"`
	VictimStreams       int   `json:"victim_streams"`
	// BacklogBytes is the victim's WAL payload not in S3 when it was
	// killed (its own count, read just before the kill).
	BacklogBytes uint64 `json:"backlog_bytes"`
	// UploadedBytes and RecordsRecovered are what the recovery read from
	// the victim's WAL and uploaded: bytes, and record batches committed.
	UploadedBytes    uint64 `json:"uploaded_bytes"`
	RecordsRecovered uint64 `json:"records_recovered"`
	// Unbacked counts committed ranges that no object in S3 backs.
	Unbacked int64 `json:"unbacked"`
	// Automq is the AutoMQ side of the failover (brokers in mode automq).
	Automq      *AutomqSummary  `json:"automq,omitempty"`
	JobID       string          `json:"job_id"`
	JobAttempts uint32          `json:"job_attempts"`
	JobAssignee string          `json:"job_assignee"`
	OldEpoch    uint64          `json:"old_epoch"`
	NewEpoch    uint64          `json:"new_epoch"`
	Streams     []StreamSummary `json:"streams"`
}

func (f *Failover) fill(c *Cluster) {
	if f.Victim == "" {
		f.Victim = c.Brokers[0].Name
	}
	if f.Rate == 0 {
		f.Rate = 300
	}
	if f.Payload == 0 {
		f.Payload = 64
	}
	if f.Warmup == 0 {
		f.Warmup = 5 * time.Second
	}
	if f.BacklogPayload == 0 {
		f.BacklogPayload = 16 << 10
	}
	if f.After == 0 {
		f.After = 2 * time.Second
	}
	if f.Timeout == 0 {
		f.Timeout = 60 * time.Second
	}
}

func (f *Failover) say(format string, args ...any) {
	if f.Say != nil {
		f.Say(fmt.Sprintf(format, args...))
	}
}

// Run runs the scenario on a started cluster.
func (f *Failover) Run(ctx context.Context, c *Cluster) (*Summary, error) {
	f.fill(c)
	victim := c.Proc(f.Victim)
	if victim == nil {
		return nil, fmt.Errorf("%w: no broker %q", ErrInvalid, f.Victim)
	}
	sum := &Summary{Victim: f.Victim}
	ledger := filepath.Join(c.Opts.Dir, "ledger.jsonl")
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	type loadResult struct {
		rep *loadgen.LoadReport
		err error
	}
	loadDone := make(chan loadResult, 1)
	f.say("load: %.0f records/s of %d bytes over %d streams (ledger %s)", f.Rate, f.Payload, len(c.AllStreams()), ledger)
	go func() {
		rep, err := loadgen.Load(loadCtx, c.LoadConfig(loadgen.LoadConfig{Streams: c.AllStreams(),
			Rate: f.Rate, Duration: 10 * f.Timeout, PayloadBytes: f.Payload, Ledger: ledger}))
		loadDone <- loadResult{rep, err}
	}()
	ledgers := []string{ledger}

	w := newWatcher(c, f)
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); w.run(watchCtx) }()
	defer func() { stopWatch(); <-watchDone }()

	if err := sleepCtx(ctx, f.Warmup); err != nil {
		return nil, err
	}
	if f.Backlog > 0 {
		if victim.BacklogStream == 0 {
			return nil, fmt.Errorf("%w: Backlog needs a cluster with BacklogStreams", ErrInvalid)
		}
		bl := filepath.Join(c.Opts.Dir, "ledger-backlog.jsonl")
		ledgers = append(ledgers, bl)
		n := (f.Backlog + int64(f.BacklogPayload) - 1) / int64(f.BacklogPayload)
		f.say("backlog: appending %d records of %d bytes to %s's stream %d (upload_interval %s keeps them in its WAL)",
			n, f.BacklogPayload, f.Victim, victim.BacklogStream, c.Opts.UploadInterval)
		rep, err := loadgen.Load(ctx, c.LoadConfig(loadgen.LoadConfig{Streams: []uint64{victim.BacklogStream},
			Rate: 1e6, Duration: 3 * f.Timeout, MaxRecords: n, PayloadBytes: f.BacklogPayload, Ledger: bl,
			// One Append stays well under gRPC's 4 MiB message limit.
			MaxBatch: max(1, (1<<20)/f.BacklogPayload)}))
		if err != nil {
			return nil, fmt.Errorf("backlog load: %w", err)
		}
		f.say("backlog: %d records acknowledged in %d ms", rep.Acked, rep.DurationMs)
	}
	// The kill must find records in the victim's WAL that S3 lacks, or the
	// failover recovers nothing: wait until its own count says so.
	err := Poll(ctx, f.Timeout, f.Victim+"'s WAL holding records not in S3", func() error {
		st, err := c.BrokerStatus(ctx, victim)
		if err != nil {
			return err
		}
		if st.GetWalPendingBytes() == 0 {
			return fmt.Errorf("%s has uploaded everything its WAL holds (upload_interval %s)", f.Victim, c.Opts.UploadInterval)
		}
		sum.BacklogBytes = st.GetWalPendingBytes()
		f.say("%s: epoch %d, %s of WAL not in S3 yet", f.Victim, st.GetBrokerEpoch(), FormatBytes(st.GetWalPendingBytes()))
		return nil
	})
	if err != nil {
		return nil, err
	}
	if b, err := c.GetBroker(ctx, f.Victim); err == nil {
		sum.OldEpoch = b.GetEpoch()
	}
	owned, err := c.streamsLedBy(ctx, victim)
	if err != nil {
		return nil, err
	}
	sum.VictimStreams = len(owned)
	if f.BeforeKill != nil {
		if err := f.BeforeKill(ctx); err != nil {
			return nil, err
		}
	}

	killed := time.Now()
	switch {
	case c.IsAutomq():
		// The broker process dies; its agent lives on and must see it.
		if err := c.signalAutomqBroker(ctx, f, victim, len(owned)); err != nil {
			return nil, err
		}
	case f.Signal == 0 || f.Signal == syscall.SIGKILL:
		f.say("kill -9 %s (pid %d), owner of %d streams", f.Victim, victim.Pid(), len(owned))
		victim.Kill()
	default:
		f.say("kill -%d %s (pid %d: %v), owner of %d streams", int(f.Signal), f.Victim, victim.Pid(), f.Signal, len(owned))
		if err := victim.Signal(f.Signal); err != nil {
			return nil, err
		}
	}
	w.armed(killed, owned)
	if f.AfterKill != nil {
		if err := f.AfterKill(ctx); err != nil {
			return nil, err
		}
	}

	// Wait for the failover: job succeeded and every stream reopened.
	err = Poll(ctx, 3*f.Timeout, "the failover of "+f.Victim, func() error {
		if err := w.failoverErr(); err != nil {
			return Permanent(err)
		}
		if !w.done() {
			return fmt.Errorf("not done: %s", w.progress())
		}
		return nil
	})
	if err != nil {
		stopLoad()
		<-loadDone
		return nil, err
	}
	w.fill(sum, killed)
	if jobs, err := c.ListJobs(ctx, f.Victim); err == nil {
		for _, j := range jobs {
			if j.GetJobId() == sum.JobID {
				sum.ReopenAfterCloseMs = reopenAfterClose(j)
				if c.IsAutomq() {
					sum.ReopenAfterCloseMs = w.reopenAfterCloseAutomq(j)
				}
			}
		}
	}
	f.say("failover done: detected after %d ms, recovered after %d ms, streams reopened after %d ms (%d ms after the recovery closed them)",
		sum.DetectionMs, sum.RecoveryMs, sum.ReopenMs, sum.ReopenAfterCloseMs)
	if c.IsAutomq() {
		w.mu.Lock()
		job := w.job
		w.mu.Unlock()
		a, err := c.automqSummary(ctx, w, job)
		if err != nil {
			stopLoad()
			<-loadDone
			return nil, err
		}
		sum.Automq = a
		if rb := job.GetTargetReport().GetBytesUploaded(); sum.UploadedBytes == 0 {
			sum.UploadedBytes = rb
		}
		for _, line := range a.describe() {
			f.say("%s", line)
		}
	}
	if f.AfterFailover != nil {
		if err := f.AfterFailover(ctx); err != nil {
			stopLoad()
			<-loadDone
			return nil, err
		}
	}
	if err := sleepCtx(ctx, f.After); err != nil {
		return nil, err
	}
	stopLoad()
	lr := <-loadDone
	if lr.err != nil {
		return nil, fmt.Errorf("load: %w", lr.err)
	}
	sum.MaxUnavailableMs, sum.MedianUnavailableMs = lr.rep.MaxUnavailableMs, lr.rep.MedianUnavailableMs
	sum.DuplicateAcks = lr.rep.DuplicateAcks
	names := map[string]string{}
	for _, b := range c.Brokers {
		names[b.Listen] = b.Name
	}
	for _, s := range lr.rep.Streams {
		owners := make([]string, 0, len(s.Owners))
		for _, a := range s.Owners {
			if n, ok := names[a]; ok {
				a = n
			}
			owners = append(owners, a)
		}
		sum.Streams = append(sum.Streams, StreamSummary{Stream: s.Stream, Acked: s.Acked, MaxUnavailableMs: s.MaxUnavailableMs, Owners: owners})
	}
	f.say("load stopped: %d acknowledged; verifying every acknowledged record", lr.rep.Acked)
	if c.IsAutomq() {
		// The records are read from S3 only: the brokers upload what their
		// WALs hold first.
		if err := c.UploadAutomqWALs(ctx, f.Timeout); err != nil {
			return nil, err
		}
		f.say("every live broker uploaded its WAL; reading every stream back from AutoMQ's objects in S3 through the controller's view")
	}
	for _, l := range ledgers {
		v, err := c.Verify(ctx, l, f.Timeout)
		if err != nil {
			return nil, fmt.Errorf("verify %s: %w", l, err)
		}
		sum.Acked += v.Acked
		sum.Present += v.Present
		sum.Lost += v.Lost
		sum.Gaps += v.Gaps
		sum.Duplicates += v.Duplicates
		sum.Unbacked += v.Unbacked
	}
	f.say("verify: acked %d, present %d, lost %d, gaps %d, duplicates %d (retried records found stored: %d)",
		sum.Acked, sum.Present, sum.Lost, sum.Gaps, sum.Duplicates, sum.DuplicateAcks)
	return sum, nil
}

// BrokerStatus asks a broker for its status over its data API.
func (c *Cluster) BrokerStatus(ctx context.Context, b *Proc) (*waldenv1.BrokerStatusResponse, error) {
	cc, err := c.conn(b.Listen)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return waldenv1.NewBrokerAPIClient(cc).BrokerStatus(ctx, &waldenv1.BrokerStatusRequest{})
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("%w", ctx.Err())
	case <-t.C:
		return nil
	}
}

// watcher polls the registry, the jobs, the catalog and the event log and
// reports each change once.
type watcher struct {
	c *Cluster
	f *Failover

	mu       sync.Mutex
	killed   time.Time
	owned    map[uint64]bool
	events   uint64
	brokers  map[string]string
	jobs     map[string]string
	streams  map[uint64]string
	job      *waldenv1.Job
	failedMs int64
	jobSeen  bool
	reopened time.Time
	closedAt time.Time
	// amq is what the watcher saw of the AutoMQ controller (brokers in
	// mode automq).
	amq      automqWatch
	newEpoch uint64
	hookErr  error
	hookDone bool
}

func newWatcher(c *Cluster, f *Failover) *watcher {
	return &watcher{c: c, f: f, brokers: map[string]string{}, jobs: map[string]string{}, streams: map[uint64]string{}}
}

func (w *watcher) armed(killed time.Time, owned map[uint64]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.killed, w.owned = killed, owned
}

func (w *watcher) run(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		w.poll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// FormatBytes prints a byte count for people (B, KiB, MiB, GiB).
func FormatBytes(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func (w *watcher) poll(ctx context.Context) {
	evs, err := w.c.ListEvents(ctx)
	if err == nil {
		for _, e := range evs {
			if e.GetIndex() <= w.events {
				continue
			}
			w.events = e.GetIndex()
			line := fmt.Sprintf("event %-12s %-4s %s", e.GetEventKind().Name(), e.GetBrokerId(), e.GetMessage())
			if ev := e.GetEvidence(); ev != nil && ev.GetSuspectForMs() > 0 {
				line += fmt.Sprintf(" [suspect for %d ms by %d/%d, lease expired for %d ms]", ev.GetSuspectForMs(),
					len(ev.GetObservations()), ev.GetSuspicionQuorum(), ev.GetLeaseExpiredForMs())
			}
			w.f.say("%s", line)
		}
	}
	w.mu.Lock()
	victim, killed := w.f.Victim, w.killed
	w.mu.Unlock()
	if bs, err := w.c.ListBrokers(ctx); err == nil {
		for _, b := range bs {
			key := fmt.Sprintf("%s epoch %d fenced %v", b.GetBrokerState().Name(), b.GetEpoch(), b.GetFenced())
			if w.brokers[b.GetBrokerId()] != key {
				w.brokers[b.GetBrokerId()] = key
				w.f.say("broker %s: %s", b.GetBrokerId(), key)
			}
			if b.GetBrokerId() == victim && !killed.IsZero() && b.GetFailedUnixMs() >= killed.UnixMilli()-1000 {
				w.mu.Lock()
				if w.failedMs == 0 {
					w.failedMs = b.GetFailedUnixMs()
				}
				w.newEpoch = max(w.newEpoch, b.GetEpoch())
				w.mu.Unlock()
			}
		}
	}
	if js, err := w.c.ListJobs(ctx, ""); err == nil {
		for _, j := range js {
			key := fmt.Sprintf("%s step %s attempt %d on %s, uploaded %s/%s (%d records), streams closed %d/%d",
				j.GetJobState().Name(), j.GetJobStep().Name(), j.GetAttempt(), j.GetAssigneeId(), FormatBytes(j.GetBytesUploaded()),
				FormatBytes(j.GetBytesTotal()), j.GetRecordsUploaded(), j.GetStreamsClosed(), j.GetStreamsTotal())
			if j.GetError() != "" {
				key += ", error: " + j.GetError()
			}
			if w.jobs[j.GetJobId()] != key {
				w.jobs[j.GetJobId()] = key
				w.f.say("job %s (%s): %s", j.GetJobId(), j.GetBrokerId(), key)
			}
			if w.c.IsAutomq() {
				w.sayCheckpoints(j)
			}
			if j.GetBrokerId() == victim && !killed.IsZero() && j.GetCreatedUnixMs() >= killed.UnixMilli()-1000 {
				w.mu.Lock()
				w.job = j
				fire := !w.hookDone && w.f.DuringRecovery != nil
				w.mu.Unlock()
				if fire {
					done, err := w.f.DuringRecovery(ctx, j)
					w.mu.Lock()
					w.hookDone = done || err != nil
					if err != nil {
						w.hookErr = err
					}
					w.mu.Unlock()
				}
			}
		}
	}
	if w.c.IsAutomq() {
		w.pollAutomqStreams(ctx)
		return
	}
	if ss, err := w.c.ListStreams(ctx); err == nil {
		w.mu.Lock()
		owned := w.owned
		w.mu.Unlock()
		closed, reopened := 0, 0
		for _, s := range ss {
			key := fmt.Sprintf("%s by %s (stream epoch %d), end offset %d", s.GetState(), s.GetOwnerBrokerId(), s.GetEpoch(), s.GetEndOffset())
			if s.GetState() != "opened" {
				key = fmt.Sprintf("%s at end offset %d", s.GetState(), s.GetEndOffset())
			}
			old := w.streams[s.GetStreamId()]
			if !sameStreamState(old, key) {
				w.streams[s.GetStreamId()] = key
				w.f.say("stream %d: %s", s.GetStreamId(), key)
			}
			if owned[s.GetStreamId()] {
				if s.GetState() == "closed" || s.GetOwnerBrokerId() != victim {
					closed++
				}
				if s.GetState() == "opened" && s.GetOwnerBrokerId() != victim {
					reopened++
				}
			}
		}
		now := time.Now()
		w.mu.Lock()
		if len(owned) > 0 && closed == len(owned) && w.closedAt.IsZero() {
			w.closedAt = now
		}
		if len(owned) > 0 && reopened == len(owned) && w.reopened.IsZero() {
			w.reopened = now
		}
		w.mu.Unlock()
	}
}

// reopenAfterClose is the time from the recovery job's close step to the
// reopening of the last stream it closed, from the catalog's times (-1 when
// the job does not say).
func reopenAfterClose(j *waldenv1.Job) int64 {
	var closed int64
	for _, cp := range j.GetCheckpoints() {
		if cp.GetJobStep() == waldenv1.JobStep_JOB_STEP_CLOSE {
			closed = cp.GetUnixMs()
		}
	}
	if closed == 0 || j.GetReopenedUnixMs() == 0 {
		return -1
	}
	return max(j.GetReopenedUnixMs()-closed, 0)
}

// sameStreamState ignores end-offset moves of an opened stream (they change
// with every upload) so that only ownership and state changes are printed.
func sameStreamState(a, b string) bool {
	cut := func(s string) string {
		if i := strings.Index(s, ", end offset"); i > 0 && strings.HasPrefix(s, "opened") {
			return s[:i]
		}
		return s
	}
	return cut(a) == cut(b)
}

func (w *watcher) failoverErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hookErr != nil {
		return w.hookErr
	}
	if w.job != nil && (w.job.GetJobState() == waldenv1.JobState_JOB_STATE_FAILED || w.job.GetJobState() == waldenv1.JobState_JOB_STATE_CANCELLED) {
		return fmt.Errorf("recovery job %s %s: %s", w.job.GetJobId(), w.job.GetJobState().Name(), w.job.GetError())
	}
	return nil
}

func (w *watcher) done() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	hooked := w.hookDone || w.f.DuringRecovery == nil
	return hooked && w.failedMs != 0 && w.job != nil && w.job.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED && !w.reopened.IsZero()
}

func (w *watcher) progress() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var parts []string
	parts = append(parts, fmt.Sprintf("failed decision seen %v", w.failedMs != 0))
	if w.job != nil {
		parts = append(parts, fmt.Sprintf("job %s %s step %s", w.job.GetJobId(), w.job.GetJobState().Name(), w.job.GetJobStep().Name()))
	} else {
		parts = append(parts, "no job yet")
	}
	parts = append(parts, fmt.Sprintf("streams reopened %v", !w.reopened.IsZero()))
	return strings.Join(parts, ", ")
}

func (w *watcher) fill(s *Summary, killed time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s.DetectionMs = max(0, w.failedMs-killed.UnixMilli())
	if w.job != nil {
		s.JobID, s.JobAttempts, s.JobAssignee = w.job.GetJobId(), w.job.GetAttempt(), w.job.GetAssigneeId()
		s.UploadedBytes, s.RecordsRecovered = w.job.GetBytesUploaded(), w.job.GetRecordsUploaded()
		if fin := w.job.GetFinishedUnixMs(); fin > 0 {
			s.RecoveryMs = max(0, fin-killed.UnixMilli())
		}
	}
	if s.RecoveryMs == 0 && !w.closedAt.IsZero() {
		s.RecoveryMs = w.closedAt.Sub(killed).Milliseconds()
	}
	s.ReopenMs = w.reopened.Sub(killed).Milliseconds()
	s.NewEpoch = w.newEpoch
}

// Median returns the median of xs (0 for none).
func Median(xs []int64) int64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]int64(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
