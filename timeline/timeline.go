package timeline

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"

	waldenv1 "walden/proto/walden/v1"
)

// Phase kinds, in the order a failover goes through them. A recovery
// step's phase is named as the step is (JobStep.Name).
const (
	KindObserve   = "observe"
	KindDecide    = "decide"
	KindFence     = "fence"
	KindLeaseWait = "lease_wait"
	KindAttach    = "attach"
	KindRead      = "read"
	KindUpload    = "upload"
	KindCommit    = "commit"
	KindClose     = "close"
	KindDetach    = "detach"
	KindReopen    = "reopen"
)

// Kinds lists the phase kinds in order.
func Kinds() []string {
	return []string{KindObserve, KindDecide, KindFence, KindLeaseWait, KindAttach, KindRead, KindUpload, KindCommit,
		KindClose, KindDetach, KindReopen}
}

// labels are the phase kinds as people read them.
var labels = map[string]string{
	KindObserve:   "observed",
	KindDecide:    "decision",
	KindFence:     "fence",
	KindLeaseWait: "lease wait",
	KindAttach:    "attach WAL",
	KindRead:      "read WAL",
	KindUpload:    "upload",
	KindCommit:    "commit",
	KindClose:     "close streams",
	KindDetach:    "detach",
	KindReopen:    "reopen",
}

// Label is phase kind k as people read it, the row label of a timeline
// (waldenctl failover show, the web view): "attach WAL" for KindAttach. A
// kind it does not know (a step a newer walden added) is shown as it is.
func Label(k string) string {
	if l, ok := labels[k]; ok {
		return l
	}
	return k
}

// The sentences of the events an older walden recorded without their typed
// fields (Event.detail), read only for those (legacyOldEpoch,
// legacyRunning).
var (
	declaredRe = regexp.MustCompile(`^declared failed: epoch (\d+) fenced`)
	runningRe  = regexp.MustCompile(`^attempt (\d+) running on (\S+)`)
)

// Build tells the failover of job j. events are the event log of j's
// broker (any order; events of other jobs are ignored). A phase still going
// on has end 0; the renderers draw it up to their "now".
func Build(j *waldenv1.Job, events []*waldenv1.Event) *waldenv1.Failover {
	f := &waldenv1.Failover{
		Id: j.GetJobId(), BrokerId: j.GetBrokerId(), NewEpoch: j.GetToken(), JobState: j.GetJobState(), JobStep: j.GetJobStep(),
		RecoveredBy: j.GetAssigneeId(), Attempts: j.GetAttempt(), DecidedUnixMs: j.GetCreatedUnixMs(),
		FinishedUnixMs: j.GetFinishedUnixMs(), BytesUploaded: j.GetBytesUploaded(), BytesTotal: j.GetBytesTotal(),
		RecordsUploaded: j.GetRecordsUploaded(), Objects: uint32(len(j.GetObjects())), StreamsTotal: j.GetStreamsTotal(),
		StreamsClosed: j.GetStreamsClosed(), StreamsReopened: j.GetStreamsReopened(), Error: j.GetError(),
	}
	evs := slices.Clone(events)
	slices.SortFunc(evs, func(a, b *waldenv1.Event) int {
		switch {
		case a.GetIndex() < b.GetIndex():
			return -1
		case a.GetIndex() > b.GetIndex():
			return 1
		}
		return 0
	})
	assigneeOf := map[uint32]string{}
	var requested *waldenv1.Event // the manual failover request the decision followed
	decided := false
	for _, e := range evs {
		switch {
		case decided:
		case e.GetEventKind() == waldenv1.EventKind_EVENT_KIND_FAILOVER_REQUESTED:
			requested = e
		case e.GetEventKind() == waldenv1.EventKind_EVENT_KIND_DECISION && e.GetJobId() != j.GetJobId():
			requested = nil // the request of an earlier failover
		case e.GetEventKind() == waldenv1.EventKind_EVENT_KIND_DECISION:
			decided = true
		}
		if e.GetJobId() != j.GetJobId() {
			continue
		}
		switch e.GetEventKind() {
		case waldenv1.EventKind_EVENT_KIND_DECISION:
			f.DecidedUnixMs = e.GetUnixMs()
			f.DecidedBy = e.GetActor()
			f.Evidence = e.GetEvidence()
			f.Manual = e.GetEvidence().GetManual()
			f.Reason = e.GetEvidence().GetReason()
			f.OldEpoch = e.GetDetail().GetEpoch()
			if e.GetDetail() == nil {
				f.OldEpoch = legacyOldEpoch(e)
			}
		case waldenv1.EventKind_EVENT_KIND_JOB:
			attempt, member, ok := running(e)
			if ok {
				assigneeOf[attempt] = member
				if len(f.Assignees) == 0 || f.Assignees[len(f.Assignees)-1] != member {
					f.Assignees = append(f.Assignees, member)
				}
			}
		}
	}
	if f.DecidedBy == "" {
		f.DecidedBy = f.GetEvidence().GetDecidedBy()
	}
	if len(f.Assignees) == 0 || f.Assignees[len(f.Assignees)-1] != j.GetAssigneeId() {
		if j.GetAssigneeId() != "" {
			f.Assignees = append(f.Assignees, j.GetAssigneeId())
		}
	}
	assigneeOf[j.GetAttempt()] = j.GetAssigneeId()
	actorOf := func(attempt uint32) string {
		if a, ok := assigneeOf[attempt]; ok {
			return a
		}
		return j.GetAssigneeId()
	}

	// What each coordinator observed until the decision, from its last
	// contact with the broker (the silence the decision counts, "not heard
	// for"), not from its first suspicion, which comes only after probes
	// failed.
	for _, o := range f.GetEvidence().GetObservations() {
		if s := o.GetObservationState(); s != waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT && s != waldenv1.ObservationState_OBSERVATION_STATE_DEAD {
			continue
		}
		if f.FirstSuspectUnixMs == 0 || o.GetSinceUnixMs() < f.FirstSuspectUnixMs {
			f.FirstSuspectUnixMs = o.GetSinceUnixMs()
		}
		f.Phases = append(f.Phases, &waldenv1.FailoverPhase{Kind: KindObserve, Actor: o.GetObserverId(),
			StartUnixMs: lastContact(o), EndUnixMs: f.DecidedUnixMs, Detail: observed(o)})
	}
	// A manual failover waits, between the request and the decision, for a
	// majority of the coordinators to attest the broker's lease expired.
	if requested != nil && f.Manual && decided {
		f.Phases = append(f.Phases, &waldenv1.FailoverPhase{Kind: KindLeaseWait, Actor: requested.GetActor(),
			StartUnixMs: requested.GetUnixMs(), EndUnixMs: f.DecidedUnixMs,
			Detail: "renewals stopped; fenced once a majority of the coordinators attested the broker's lease expired"})
	}
	f.Phases = append(f.Phases, &waldenv1.FailoverPhase{Kind: KindDecide, Actor: f.DecidedBy,
		StartUnixMs: f.DecidedUnixMs, EndUnixMs: f.DecidedUnixMs, Detail: f.Reason})

	// The recovery job's steps: each runs from the end of the one before.
	prev := f.DecidedUnixMs
	lastClose := int64(0)
	for _, cp := range j.GetCheckpoints() {
		at, actor := cp.GetUnixMs(), actorOf(cp.GetAttempt())
		if cp.GetJobStep() == waldenv1.JobStep_JOB_STEP_FENCE && j.GetLeaseWaitMs() > 0 {
			waitFrom := max(prev, at-j.GetLeaseWaitMs())
			f.Phases = append(f.Phases, &waldenv1.FailoverPhase{Kind: KindFence, Actor: actor, StartUnixMs: prev, EndUnixMs: waitFrom,
				Detail: cp.GetDetail(), Attempt: cp.GetAttempt()},
				&waldenv1.FailoverPhase{Kind: KindLeaseWait, Actor: actor, StartUnixMs: waitFrom, EndUnixMs: at,
					Detail: "the broker may hold a valid lease until then; its WAL is read after", Attempt: cp.GetAttempt()})
		} else {
			f.Phases = append(f.Phases, &waldenv1.FailoverPhase{Kind: cp.GetJobStep().Name(), Actor: actor, StartUnixMs: prev, EndUnixMs: at,
				Detail: cp.GetDetail(), Attempt: cp.GetAttempt()})
		}
		if cp.GetJobStep() == waldenv1.JobStep_JOB_STEP_CLOSE {
			lastClose = at
		}
		prev = at
	}
	active := j.GetJobState() == waldenv1.JobState_JOB_STATE_PENDING || j.GetJobState() == waldenv1.JobState_JOB_STATE_RUNNING
	if active && j.GetJobStep() != waldenv1.JobStep_JOB_STEP_UNSPECIFIED && j.GetJobStep() != waldenv1.JobStep_JOB_STEP_DONE {
		f.Phases = append(f.Phases, &waldenv1.FailoverPhase{Kind: j.GetJobStep().Name(), Actor: j.GetAssigneeId(), StartUnixMs: prev,
			Detail: runningDetail(j), Attempt: j.GetAttempt()})
	}

	// The reopening of the closed streams by other brokers.
	if j.GetStreamsTotal() > 0 && (j.GetStreamsReopened() > 0 || j.GetJobState() == waldenv1.JobState_JOB_STATE_SUCCEEDED) {
		from := lastClose
		if from == 0 {
			from = max(j.GetFinishedUnixMs(), prev)
		}
		p := &waldenv1.FailoverPhase{Kind: KindReopen, StartUnixMs: from,
			Detail: strconv.Itoa(int(j.GetStreamsReopened())) + " of " + strconv.Itoa(int(closedCount(j))) + " streams open on other brokers"}
		if j.GetStreamsReopened() >= closedCount(j) {
			p.EndUnixMs = max(j.GetReopenedUnixMs(), from)
			f.ReopenedUnixMs = j.GetReopenedUnixMs()
		}
		f.Phases = append(f.Phases, p)
	}
	return f
}

// closedCount is the number of streams the job closed (or must close).
func closedCount(j *waldenv1.Job) uint32 {
	return max(j.GetStreamsClosed(), j.GetStreamsTotal())
}

func observed(o *waldenv1.Observation) string {
	s := o.GetObserverId() + " observes " + o.GetObservationState().Name()
	if o.GetReason() != "" {
		s += ": " + o.GetReason()
	}
	if u := o.GetUnheardForMs(); u > 0 {
		s += fmt.Sprintf(" (last heard %d ms before)", u)
	}
	return s
}

// running reports whether job event e says an attempt started running, and
// which attempt on which member.
func running(e *waldenv1.Event) (attempt uint32, member string, ok bool) {
	d := e.GetDetail()
	if d == nil {
		return legacyRunning(e)
	}
	return d.GetAttempt(), d.GetMember(), d.GetJobState() == waldenv1.JobState_JOB_STATE_RUNNING
}

// legacyOldEpoch is the epoch a decision recorded without its fields
// fenced, read from its message (0 when it does not say).
func legacyOldEpoch(e *waldenv1.Event) uint64 {
	m := declaredRe.FindStringSubmatch(e.GetMessage())
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseUint(m[1], 10, 64)
	return n
}

// legacyRunning is running for a job event recorded without its fields.
func legacyRunning(e *waldenv1.Event) (uint32, string, bool) {
	m := runningRe.FindStringSubmatch(e.GetMessage())
	if m == nil {
		return 0, "", false
	}
	n, _ := strconv.ParseUint(m[1], 10, 32)
	return uint32(n), m[2], true
}

// lastContact is when the observer last heard from the broker: the
// observation's time less the silence it had measured then (on the
// observer's clock; for display).
func lastContact(o *waldenv1.Observation) int64 {
	return o.GetSinceUnixMs() - max(o.GetUnheardForMs(), 0)
}

func runningDetail(j *waldenv1.Job) string {
	if j.GetError() != "" {
		return "retrying: " + j.GetError()
	}
	if j.GetJobState() == waldenv1.JobState_JOB_STATE_PENDING {
		return "waiting for " + j.GetAssigneeId() + " to start"
	}
	return "in progress"
}

// Duration is a phase's duration in milliseconds, measured up to nowUnixMs
// while it is still going on.
func Duration(p *waldenv1.FailoverPhase, nowUnixMs int64) int64 {
	end := p.GetEndUnixMs()
	if end == 0 {
		end = nowUnixMs
	}
	return max(end-p.GetStartUnixMs(), 0)
}

// Span returns the first start and the last end of f's phases (up to
// nowUnixMs for phases still going on).
func Span(f *waldenv1.Failover, nowUnixMs int64) (start, end int64) {
	for _, p := range f.GetPhases() {
		e := p.GetEndUnixMs()
		if e == 0 {
			e = nowUnixMs
		}
		if start == 0 || p.GetStartUnixMs() < start {
			start = p.GetStartUnixMs()
		}
		end = max(end, e)
	}
	return start, end
}
