package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	waldenv1 "walden/proto/walden/v1"
)

// Recovery are the series of the recovery jobs this coordinator executes:
//
//	walden_recovery_step_duration_seconds{step,result}  one run of a step, on the executor's clock
//	walden_recovery_uploaded_bytes_total                bytes uploaded to S3 by the builtin recovery
//
// Its methods do nothing on a nil *Recovery.
type Recovery struct {
	steps    *prometheus.HistogramVec
	uploaded prometheus.Counter
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
			Help: "Bytes the recovery jobs executed by this member uploaded to S3 (builtin action; objects that were already complete are not counted).",
		}),
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
	return []prometheus.Collector{r.steps, r.uploaded}
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
