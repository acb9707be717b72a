package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	waldenv1 "walden/proto/walden/v1"
)

// Recovery are the series of the recovery jobs this coordinator executes:
//
//	walden_recovery_step_duration_seconds{step,result}  one run of a step, on the executor's clock
//	walden_recovery_uploaded_bytes_total                bytes uploaded to S3 by the recovery
//	walden_recovery_target_objects_total{target,kind}   objects a target committed (automq: stream_set, stream)
//	walden_recovery_target_records_total{target}        record batches a target committed
//	walden_recovery_target_streams_closed_total{target} streams a target closed
//
// Its methods do nothing on a nil *Recovery.
type Recovery struct {
	steps    *prometheus.HistogramVec
	uploaded prometheus.Counter
	objects  *prometheus.CounterVec
	records  *prometheus.CounterVec
	closed   *prometheus.CounterVec
}

// NewRecovery creates the series.
func NewRecovery() *Recovery {
	r := &Recovery{
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "walden_recovery_step_duration_seconds",
			Help: "Duration of one run of a recovery step on the member executing the job, by step and result (ok, or error: the step is retried).",
			// 10ms to about 45 minutes: a fence or commit takes milliseconds,
			// an upload of a large WAL minutes.
			Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 14),
		}, []string{"step", "result"}),
		uploaded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "walden_recovery_uploaded_bytes_total",
			Help: "Bytes the recovery jobs executed by this member uploaded to S3 (objects that were already complete are not counted).",
		}),
		objects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "walden_recovery_target_objects_total",
			Help: "Objects the recovery jobs executed by this member committed at their target's system of record (automq: AutoMQ's controller), by target and object kind.",
		}, []string{"target", "kind"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "walden_recovery_target_records_total",
			Help: "Record batches the recovery jobs executed by this member committed at their target, by target.",
		}, []string{"target"}),
		closed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "walden_recovery_target_streams_closed_total",
			Help: "Streams the recovery jobs executed by this member closed at their target, by target.",
		}, []string{"target"}),
	}
	for _, s := range RecoverySteps {
		for _, res := range StepResults {
			r.steps.WithLabelValues(s, res)
		}
	}
	return r
}

// Collectors are the series to register.
func (r *Recovery) Collectors() []prometheus.Collector {
	return []prometheus.Collector{r.steps, r.uploaded, r.objects, r.records, r.closed}
}

// TargetCommitted counts objects of kind committed by target, holding
// records record batches.
func (r *Recovery) TargetCommitted(target, kind string, objects int, records int64) {
	if r == nil {
		return
	}
	if objects > 0 {
		r.objects.WithLabelValues(target, kind).Add(float64(objects))
	}
	if records > 0 {
		r.records.WithLabelValues(target).Add(float64(records))
	}
}

// TargetStreamsClosed counts n streams closed by target.
func (r *Recovery) TargetStreamsClosed(target string, n int) {
	if r != nil && n > 0 {
		r.closed.WithLabelValues(target).Add(float64(n))
	}
}

// StepRun records one run of step that took d; failed says it returned an
// error.
func (r *Recovery) StepRun(step waldenv1.JobStep, d time.Duration, failed bool) {
	if r == nil {
		return
	}
	res := "ok"
	if failed {
		res = "error"
	}
	r.steps.WithLabelValues(bounded(step.Name(), RecoverySteps), res).Observe(d.Seconds())
}

// Uploaded counts n bytes uploaded.
func (r *Recovery) Uploaded(n int64) {
	if r != nil && n > 0 {
		r.uploaded.Add(float64(n))
	}
}
