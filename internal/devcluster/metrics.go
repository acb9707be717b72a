package devcluster

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Samples are one scrape of a /metrics endpoint: the samples of every
// series by name. A histogram gives NAME_bucket (with le), NAME_count and
// NAME_sum, a summary NAME (with quantile), NAME_count and NAME_sum, as in
// the text format.
type Samples map[string][]Sample

// Sample is one sample: its labels and value.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Scrape reads http://addr/metrics.
func (c *Cluster) Scrape(ctx context.Context, addr string) (Samples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.HTTPClient(5 * time.Second).Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", addr, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", addr, err)
	}
	out := Samples{}
	for name, mf := range families {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			add := func(n string, v float64, extra ...string) {
				ls := labels
				if len(extra) > 0 {
					ls = map[string]string{}
					for k, v := range labels {
						ls[k] = v
					}
					ls[extra[0]] = extra[1]
				}
				out[n] = append(out[n], Sample{Labels: ls, Value: v})
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				add(name, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, m.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				add(name, m.GetUntyped().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				add(name+"_count", float64(h.GetSampleCount()))
				add(name+"_sum", h.GetSampleSum())
				for _, b := range h.GetBucket() {
					add(name+"_bucket", float64(b.GetCumulativeCount()), "le", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64))
				}
			case dto.MetricType_SUMMARY:
				s := m.GetSummary()
				add(name+"_count", float64(s.GetSampleCount()))
				add(name+"_sum", s.GetSampleSum())
				for _, q := range s.GetQuantile() {
					add(name, q.GetValue(), "quantile", strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64))
				}
			}
		}
	}
	return out, nil
}

// Value sums the samples of name whose labels include every pair of
// labels ("state", "failed", ...); 0 when there is none.
func (s Samples) Value(name string, labels ...string) float64 {
	var sum float64
	for _, smp := range s[name] {
		if smp.matches(labels) {
			sum += smp.Value
		}
	}
	return sum
}

// Has reports whether a sample of name with the labels exists.
func (s Samples) Has(name string, labels ...string) bool {
	for _, smp := range s[name] {
		if smp.matches(labels) {
			return true
		}
	}
	return false
}

func (smp Sample) matches(labels []string) bool {
	for i := 0; i+1 < len(labels); i += 2 {
		if smp.Labels[labels[i]] != labels[i+1] {
			return false
		}
	}
	return true
}
