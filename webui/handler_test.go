package webui_test

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	waldenv1 "walden/proto/walden/v1"
	"walden/timeline"
	"walden/webui"
)

const t0 = int64(1_700_000_000_000)

type fakeSource struct{ events []*waldenv1.Event }

func (fakeSource) Status(context.Context) (*waldenv1.StatusResponse, error) {
	return &waldenv1.StatusResponse{ClusterName: "demo", NodeId: "c2", LeaderId: "c1", Term: 4, Members: []*waldenv1.Member{
		{Id: "c1", MemberRole: waldenv1.MemberRole_MEMBER_ROLE_LEADER, Reachable: true}, {Id: "c2", MemberRole: waldenv1.MemberRole_MEMBER_ROLE_FOLLOWER, Reachable: true}}}, nil
}

func (fakeSource) Brokers(context.Context) ([]*waldenv1.Broker, map[string][]string, error) {
	return []*waldenv1.Broker{
			{BrokerId: "b1", BrokerState: waldenv1.BrokerState_BROKER_STATE_RECOVERING, Epoch: 7, LeaseRemainingMs: 0},
			{BrokerId: "b2", BrokerState: waldenv1.BrokerState_BROKER_STATE_SUSPECT, Epoch: 2, LeaseRemainingMs: 1200, Automq: &waldenv1.AutomqNode{NodeId: 4, NodeEpoch: 1732870000000}, Observations: []*waldenv1.Observation{{ObserverId: "c1", ObservationState: waldenv1.ObservationState_OBSERVATION_STATE_SUSPECT, SinceUnixMs: t0}}},
		},
		map[string][]string{"b2": {"suspected by 1 of the 2 coordinators needed"}}, nil
}

func (fakeSource) Jobs(context.Context) ([]*waldenv1.Job, error) {
	return []*waldenv1.Job{sampleJob()}, nil
}

func sampleJob() *waldenv1.Job {
	return &waldenv1.Job{JobId: "job-b1-7", BrokerId: "b1", Token: 7, Attempt: 1, AssigneeId: "c3", JobState: waldenv1.JobState_JOB_STATE_RUNNING, JobStep: waldenv1.JobStep_JOB_STEP_UPLOAD,
		CreatedUnixMs: t0 + 5000, BytesUploaded: 1 << 20, BytesTotal: 4 << 20, StreamsTotal: 3,
		Checkpoints: []*waldenv1.Checkpoint{{JobStep: waldenv1.JobStep_JOB_STEP_FENCE, Attempt: 1, UnixMs: t0 + 5100}, {JobStep: waldenv1.JobStep_JOB_STEP_ATTACH, Attempt: 1, UnixMs: t0 + 5150},
			{JobStep: waldenv1.JobStep_JOB_STEP_READ, Attempt: 1, UnixMs: t0 + 5300, Detail: "12 records <script>"}}}
}

func (fakeSource) Failovers(context.Context, string) ([]*waldenv1.Failover, error) {
	return []*waldenv1.Failover{timeline.Build(sampleJob(), nil)}, nil
}

func (fakeSource) Failover(_ context.Context, id string) (*waldenv1.Failover, error) {
	if id != "job-b1-7" {
		return nil, webui.ErrNotFound
	}
	return timeline.Build(sampleJob(), nil), nil
}

func (f fakeSource) Events(_ context.Context, broker string, _ int) ([]*waldenv1.Event, error) {
	var out []*waldenv1.Event
	for _, e := range f.events {
		if broker == "" || e.GetBrokerId() == broker {
			out = append(out, e)
		}
	}
	return out, nil
}

func (fakeSource) Policy(context.Context) (*waldenv1.Policy, error) {
	return &waldenv1.Policy{FailureTimeoutMs: 5000}, nil
}

func newServer(t *testing.T, authorize func(*http.Request) (context.Context, error)) *httptest.Server {
	src := fakeSource{events: []*waldenv1.Event{
		{Index: 1, UnixMs: t0, EventKind: waldenv1.EventKind_EVENT_KIND_REGISTER, BrokerId: "b1", Message: "registered with epoch 1"},
		{Index: 2, UnixMs: t0 + 1000, EventKind: waldenv1.EventKind_EVENT_KIND_OBSERVATION, BrokerId: "b1", Actor: "c1", Message: "c1 observes dead"},
		{Index: 3, UnixMs: t0 + 5000, EventKind: waldenv1.EventKind_EVENT_KIND_DECISION, BrokerId: "b1", Actor: "c1", Message: "declared failed"},
		{Index: 4, UnixMs: t0 + 6000, EventKind: waldenv1.EventKind_EVENT_KIND_REGISTER, BrokerId: "b2", Message: "registered with epoch 2"},
	}}
	mux := http.NewServeMux()
	mux.Handle("/ui/", webui.Handler(webui.Options{Source: src, Authorize: authorize,
		Now: func() time.Time { return time.UnixMilli(t0 + 6000) }}))
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestPageAndAssetsAreEmbedded(t *testing.T) {
	s := newServer(t, nil)
	for path, want := range map[string]string{
		"/ui/":          "text/html",
		"/ui/app.js":    "javascript",
		"/ui/style.css": "text/css",
	} {
		resp, body := get(t, s.URL+path)
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), want) || len(body) < 100 {
			t.Errorf("%s: %d %q (%d bytes)", path, resp.StatusCode, resp.Header.Get("Content-Type"), len(body))
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("%s: CSP %q", path, csp)
		}
	}
	_, page := get(t, s.URL+"/ui/")
	if strings.Contains(page, "http://") || strings.Contains(page, "https://") {
		t.Error("the page loads something from elsewhere")
	}
}

func TestOverview(t *testing.T) {
	s := newServer(t, nil)
	resp, body := get(t, s.URL+"/ui/api/overview")
	var doc struct {
		Now       int64               `json:"now_unix_ms"`
		Status    map[string]any      `json:"status"`
		Brokers   []map[string]any    `json:"brokers"`
		Holds     map[string][]string `json:"holds"`
		Jobs      []map[string]any    `json:"jobs"`
		Failovers []map[string]any    `json:"failovers"`
		Policy    map[string]any      `json:"policy"`
		Problems  []string            `json:"problems"`
	}
	if err := json.Unmarshal([]byte(body), &doc); resp.StatusCode != 200 || err != nil {
		t.Fatalf("%d %v: %s", resp.StatusCode, err, body)
	}
	if doc.Status["leader_id"] != "c1" || len(doc.Brokers) != 2 || doc.Brokers[1]["state"] != "suspect" ||
		len(doc.Holds["b2"]) != 1 || len(doc.Jobs) != 1 || len(doc.Failovers) != 1 || doc.Policy["failure_timeout_ms"] != "5000" ||
		len(doc.Problems) != 0 {
		t.Fatalf("overview: %s", body)
	}
	// The broker table shows an AutoMQ broker's node (app.js reads
	// automq.node_id and automq.node_epoch); other brokers carry none.
	if a, _ := doc.Brokers[1]["automq"].(map[string]any); a == nil || a["node_id"] != float64(4) || a["node_epoch"] != "1732870000000" || doc.Brokers[0]["automq"] != nil {
		t.Fatalf("brokers' AutoMQ nodes: %v, %v", doc.Brokers[0]["automq"], doc.Brokers[1]["automq"])
	}
	if ps, _ := doc.Failovers[0]["phases"].([]any); len(ps) < 4 {
		t.Fatalf("failover phases: %v", doc.Failovers[0])
	}
}

func TestEventFilters(t *testing.T) {
	s := newServer(t, nil)
	for query, want := range map[string]string{
		"":                          "1,2,3,4",
		"broker=b1":                 "1,2,3",
		"kind=register":             "1,4",
		"kind=observation,decision": "2,3",
		"since=2s":                  "3,4",
		"since=1700000001000":       "2,3,4",
		"q=DECLARED":                "3",
		"limit=2":                   "3,4",
		"broker=b1&kind=register":   "1",
	} {
		resp, body := get(t, s.URL+"/ui/api/events?"+query)
		var doc struct {
			Events []struct {
				Index string `json:"index"`
			} `json:"events"`
		}
		if err := json.Unmarshal([]byte(body), &doc); resp.StatusCode != 200 || err != nil {
			t.Fatalf("%s: %d %v %s", query, resp.StatusCode, err, body)
		}
		var got []string
		for _, e := range doc.Events {
			got = append(got, e.Index)
		}
		if strings.Join(got, ",") != want {
			t.Errorf("events?%s = %v, want %s", query, got, want)
		}
	}
	for _, bad := range []string{"limit=many", "since=yesterday"} {
		if resp, _ := get(t, s.URL+"/ui/api/events?"+bad); resp.StatusCode != 400 {
			t.Errorf("%s: %d", bad, resp.StatusCode)
		}
	}
}

func TestTimelineSVG(t *testing.T) {
	s := newServer(t, nil)
	resp, body := get(t, s.URL+"/ui/api/failovers/job-b1-7/timeline.svg")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "image/svg+xml" {
		t.Fatalf("%d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// Well-formed XML, one group per phase, the running one marked, and
	// the details escaped.
	d := xml.NewDecoder(strings.NewReader(body))
	var kinds []string
	running := 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not XML: %v\n%s", err, body)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "g" {
			for _, a := range se.Attr {
				if a.Name.Local == "data-kind" {
					kinds = append(kinds, a.Value)
				}
				if a.Name.Local == "data-running" && a.Value == "true" {
					running++
				}
			}
		}
	}
	if strings.Join(kinds, ",") != "decide,fence,attach,read,upload" || running != 1 {
		t.Fatalf("kinds %v running %d\n%s", kinds, running, body)
	}
	if strings.Contains(body, "<script>") || !strings.Contains(body, "&lt;script&gt;") {
		t.Fatal("detail not escaped")
	}
	if resp, _ := get(t, s.URL+"/ui/api/failovers/job-x/timeline.svg"); resp.StatusCode != 404 {
		t.Fatalf("unknown failover: %d", resp.StatusCode)
	}
	if resp, body := get(t, s.URL+"/ui/api/failovers/job-x"); resp.StatusCode != 404 || strings.TrimSpace(body) != `{"error":"failover job-x: not found"}` {
		t.Fatalf("unknown failover: %d %s", resp.StatusCode, body)
	}
	if resp, body := get(t, s.URL+"/ui/api/failovers/job-b1-7"); resp.StatusCode != 200 || !strings.Contains(body, `"broker_id":"b1"`) {
		t.Fatalf("failover json: %d %s", resp.StatusCode, body)
	}
}

func TestReadOnlyAndAuthorized(t *testing.T) {
	s := newServer(t, func(r *http.Request) (context.Context, error) {
		if r.Header.Get("X-Role") != "reader" {
			return nil, errors.New("the reader role is needed")
		}
		return r.Context(), nil
	})
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/ui/api/overview", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 403 || !strings.Contains(string(b), "reader role") {
		t.Fatalf("unauthorized: %d %s", resp.StatusCode, b)
	}
	req.Header.Set("X-Role", "reader")
	if resp, err = http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("authorized: %v %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		req, _ := http.NewRequest(m, s.URL+"/ui/api/overview", strings.NewReader("{}"))
		req.Header.Set("X-Role", "reader")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s: %d", m, resp.StatusCode)
		}
	}
}
