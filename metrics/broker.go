package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// BrokerStatus is what a reference broker reports about itself
// (walden.v1.BrokerAPI BrokerStatus).
type BrokerStatus struct {
	// Serving says the broker acknowledges appends now.
	Serving bool
	// Uploads counts the objects the broker uploaded and committed since it
	// started.
	Uploads uint64
	// WALPendingBytes is the record payload in the WAL not yet uploaded: what
	// a recovery would have to upload if the broker died now.
	WALPendingBytes uint64
	// Streams is the number of streams the broker holds open.
	Streams int
}

// BrokerCollector reports a reference broker's status at every scrape,
// labelled with its broker_id:
//
//	walden_broker_serving            1 while the broker acknowledges appends
//	walden_broker_uploads_total      objects uploaded and committed since the process started
//	walden_broker_wal_pending_bytes  payload in the WAL not yet in S3 (the backlog a failover would recover)
//	walden_broker_streams            streams the broker holds open
type BrokerCollector struct {
	status                             func() BrokerStatus
	serving, uploads, pending, streams *prometheus.Desc
}

// NewBrokerCollector returns the collector of broker brokerID.
func NewBrokerCollector(brokerID string, status func() BrokerStatus) *BrokerCollector {
	l := prometheus.Labels{"broker_id": brokerID}
	return &BrokerCollector{
		status:  status,
		serving: prometheus.NewDesc("walden_broker_serving", "1 while the broker acknowledges appends (registered, lease valid, not fenced, not stopping), else 0.", nil, l),
		uploads: prometheus.NewDesc("walden_broker_uploads_total", "Objects the broker uploaded to S3 and committed to the catalog since it started.", nil, l),
		pending: prometheus.NewDesc("walden_broker_wal_pending_bytes", "Record payload bytes in the broker's WAL that are not yet uploaded: what a failover would recover if the broker died now.", nil, l),
		streams: prometheus.NewDesc("walden_broker_streams", "Streams the broker holds open.", nil, l),
	}
}

// Describe implements prometheus.Collector.
func (c *BrokerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.serving
	ch <- c.uploads
	ch <- c.pending
	ch <- c.streams
}

// Collect implements prometheus.Collector.
func (c *BrokerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.status()
	ch <- prometheus.MustNewConstMetric(c.serving, prometheus.GaugeValue, b2f(s.Serving))
	ch <- prometheus.MustNewConstMetric(c.uploads, prometheus.CounterValue, float64(s.Uploads))
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(s.WALPendingBytes))
	ch <- prometheus.MustNewConstMetric(c.streams, prometheus.GaugeValue, float64(s.Streams))
}
