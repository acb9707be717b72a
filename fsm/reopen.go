package fsm

import (
	waldenv1 "walden/proto/walden/v1"
)

// A failover ends for the producers when the dead broker's streams are open
// again on other brokers. The state machine keeps that moment on the
// recovery job: a stream closed in failover mode remembers the job that
// closed it, and the next open of the stream counts it as reopened on that
// job (the failover's timeline shows it as the reopen phase).

// noteFailoverClose records that job j closed stream st in failover mode.
func noteFailoverClose(st *waldenv1.Stream, j *waldenv1.Job) {
	if j != nil {
		st.ClosedByJobId = j.GetJobId()
	}
}

// noteReopen counts the opening of a closed stream st on the job that
// closed it, if a failover did; it must be called before the stream is
// changed to opened.
func (s *State) noteReopen(st *waldenv1.Stream) {
	id := st.GetClosedByJobId()
	if id == "" {
		return
	}
	st.ClosedByJobId = ""
	j, ok := s.jobs[id]
	if !ok {
		return
	}
	j.StreamsReopened++
	if j.FirstReopenedUnixMs == 0 {
		j.FirstReopenedUnixMs = s.now()
	}
	j.ReopenedUnixMs = s.now()
}
