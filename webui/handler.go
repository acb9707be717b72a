package webui

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	waldenv1 "walden/proto/walden/v1"
)

//go:embed assets
var assets embed.FS

// Source is what the web view shows. The server implements it over its
// replicated state and its API services; every method only reads.
type Source interface {
	// Status is the answering member's view of the cluster.
	Status(ctx context.Context) (*waldenv1.StatusResponse, error)
	// Brokers are the registered brokers (with their lease as the leader
	// sees it) and, per suspect broker, why it is not failed over yet.
	Brokers(ctx context.Context) ([]*waldenv1.Broker, map[string][]string, error)
	// Jobs are the recovery jobs, oldest first.
	Jobs(ctx context.Context) ([]*waldenv1.Job, error)
	// Failovers are the failovers of a broker (all when empty), oldest
	// first; Failover one of them by id.
	Failovers(ctx context.Context, brokerID string) ([]*waldenv1.Failover, error)
	Failover(ctx context.Context, id string) (*waldenv1.Failover, error)
	// Events are the newest limit events (0: all kept) of a broker (all
	// when empty), oldest first.
	Events(ctx context.Context, brokerID string, limit int) ([]*waldenv1.Event, error)
	// Policy is the effective failover policy.
	Policy(ctx context.Context) (*waldenv1.Policy, error)
}

// ErrNotFound is what a Source returns for an unknown id.
var ErrNotFound = errors.New("webui: not found")

// Options configure the handler.
type Options struct {
	Source Source
	// Authorize is asked about every request before anything is served; a
	// non-nil error refuses it with 403 Forbidden and the error's text.
	// The listener's TLS has already checked the client certificate; this
	// is where the identity's role is checked (the view needs "reader").
	// It returns the context to serve the request with (carrying the
	// identity, so that the Source can act for it). nil allows every
	// request the listener accepted.
	Authorize func(r *http.Request) (context.Context, error)
	// Now is the clock of the "now" the page draws running phases to
	// (default time.Now).
	Now func() time.Time
	// Timeout bounds each API request to the Source (default 3s).
	Timeout time.Duration
}

type handler struct {
	o   Options
	mux *http.ServeMux
}

// Handler returns the web view; mount it at /ui/ (it serves paths under
// /ui/ only).
func Handler(o Options) http.Handler {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Timeout <= 0 {
		o.Timeout = 3 * time.Second
	}
	h := &handler{o: o, mux: http.NewServeMux()}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is part of the binary
	}
	files := http.FileServerFS(static)
	h.mux.Handle("GET /ui/", http.StripPrefix("/ui/", files))
	h.mux.HandleFunc("GET /ui/api/overview", h.overview)
	h.mux.HandleFunc("GET /ui/api/events", h.events)
	h.mux.HandleFunc("GET /ui/api/failovers/{id}", h.failover)
	h.mux.HandleFunc("GET /ui/api/failovers/{id}/timeline.svg", h.timelineSVG)
	return h
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Cache-Control", "no-store")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hd.Set("Allow", "GET, HEAD")
		http.Error(w, "the web view is read-only", http.StatusMethodNotAllowed)
		return
	}
	if h.o.Authorize != nil {
		ctx, err := h.o.Authorize(r)
		if err != nil {
			http.Error(w, "forbidden: "+err.Error(), http.StatusForbidden)
			return
		}
		r = r.WithContext(ctx)
	}
	h.mux.ServeHTTP(w, r)
}

func (h *handler) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), h.o.Timeout)
}

// raw encodes a proto message for embedding in a JSON document, in the
// JSON waldenctl -o json prints too (names such as "alive" in the fields
// that have always carried them).
func raw(m proto.Message) json.RawMessage {
	b, err := waldenv1.MarshalJSON(m)
	if err != nil {
		return json.RawMessage("null")
	}
	return b
}

func rawList[T proto.Message](ms []T) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(ms))
	for _, m := range ms {
		out = append(out, raw(m))
	}
	return out
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_ = json.NewEncoder(w).Encode(v)
}

// apiError answers a failed Source call: 404 for an unknown id, 503
// otherwise (the member cannot answer now; the page retries).
func apiError(w http.ResponseWriter, what string, err error) {
	code, msg := http.StatusServiceUnavailable, err.Error()
	if errors.Is(err, ErrNotFound) {
		code, msg = http.StatusNotFound, "not found"
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": what + ": " + msg})
}

// overview is everything the page shows but the event log and the
// timelines' pictures, in one answer.
func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	st, err := h.o.Source.Status(ctx)
	if err != nil {
		apiError(w, "cluster status", err)
		return
	}
	doc := map[string]any{"now_unix_ms": h.o.Now().UnixMilli(), "status": raw(st)}
	problems := []string{}
	if bs, holds, err := h.o.Source.Brokers(ctx); err == nil {
		doc["brokers"], doc["holds"] = rawList(bs), holds
	} else {
		problems = append(problems, "brokers: "+err.Error())
	}
	if js, err := h.o.Source.Jobs(ctx); err == nil {
		doc["jobs"] = rawList(js)
	} else {
		problems = append(problems, "jobs: "+err.Error())
	}
	if fs, err := h.o.Source.Failovers(ctx, ""); err == nil {
		doc["failovers"] = rawList(fs)
	} else {
		problems = append(problems, "failovers: "+err.Error())
	}
	if evs, err := h.o.Source.Events(ctx, "", 0); err == nil {
		doc["history"] = brokerHistory(evs)
	} else {
		problems = append(problems, "events: "+err.Error())
	}
	if p, err := h.o.Source.Policy(ctx); err == nil {
		doc["policy"] = raw(p)
	} else {
		problems = append(problems, "policy: "+err.Error())
	}
	doc["problems"] = problems
	writeJSON(w, doc)
}

// events answers the event log, filtered by broker, kinds (comma
// separated), since (Unix ms or a duration before now such as 10m) and
// text, newest limit kept (default 200).
func (h *handler) events(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	q := r.URL.Query()
	limit := 200
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			http.Error(w, "limit: not a number of events", http.StatusBadRequest)
			return
		}
		limit = n
	}
	var since int64
	if v := q.Get("since"); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			since = h.o.Now().Add(-d).UnixMilli()
		} else if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
			since = ms
		} else {
			http.Error(w, "since: give Unix milliseconds or a duration such as 10m", http.StatusBadRequest)
			return
		}
	}
	kinds := map[string]bool{}
	for _, k := range strings.Split(q.Get("kind"), ",") {
		if k = strings.TrimSpace(k); k != "" {
			kinds[k] = true
		}
	}
	text := strings.ToLower(q.Get("q"))
	evs, err := h.o.Source.Events(ctx, q.Get("broker"), 0)
	if err != nil {
		apiError(w, "events", err)
		return
	}
	var out []*waldenv1.Event
	for _, e := range evs {
		if (len(kinds) > 0 && !kinds[e.GetEventKind().Name()]) || e.GetUnixMs() < since ||
			(text != "" && !strings.Contains(strings.ToLower(e.GetMessage()+" "+e.GetActor()+" "+e.GetJobId()), text)) {
			continue
		}
		out = append(out, e)
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	writeJSON(w, map[string]any{"events": rawList(out)})
}

func (h *handler) failover(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	f, err := h.o.Source.Failover(ctx, r.PathValue("id"))
	if err != nil {
		apiError(w, "failover "+r.PathValue("id"), err)
		return
	}
	writeJSON(w, map[string]any{"failover": raw(f), "now_unix_ms": h.o.Now().UnixMilli()})
}

func (h *handler) timelineSVG(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := h.ctx(r)
	defer cancel()
	f, err := h.o.Source.Failover(ctx, r.PathValue("id"))
	if err != nil {
		apiError(w, "failover "+r.PathValue("id"), err)
		return
	}
	w.Header().Set("Content-Type", "image/svg+xml")
	_, _ = w.Write(SVG(f, h.o.Now().UnixMilli()))
}
