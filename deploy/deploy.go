package deploy

import (
	"embed"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"

	"go.yaml.in/yaml/v3"
)

//go:embed grafana/*.json prometheus/*.yml
var files embed.FS

// Rule is one Prometheus alert rule.
type Rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// AlertRules returns the rules of prometheus/alerts.yml.
func AlertRules() ([]Rule, error) {
	b, err := files.ReadFile("prometheus/alerts.yml")
	if err != nil {
		return nil, err
	}
	var doc struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []Rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	dec := yaml.NewDecoder(bytesReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("deploy: prometheus/alerts.yml: %w", err)
	}
	var rules []Rule
	for _, g := range doc.Groups {
		rules = append(rules, g.Rules...)
	}
	return rules, nil
}

// Panel is one panel of the dashboard with its queries.
type Panel struct {
	Title string
	Exprs []string
}

// DashboardPanels returns the panels of grafana/walden.json that query.
func DashboardPanels() ([]Panel, error) {
	b, err := files.ReadFile("grafana/walden.json")
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("deploy: grafana/walden.json: %w", err)
	}
	var out []Panel
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		pp := Panel{Title: p.Title}
		for _, t := range p.Targets {
			pp.Exprs = append(pp.Exprs, t.Expr)
		}
		out = append(out, pp)
	}
	return out, nil
}

// seriesRE matches the series names walden's queries use: walden_*, and
// the gRPC server series of the brokers' data API.
var seriesRE = regexp.MustCompile(`\b(walden_[a-z0-9_]+|grpc_server_[a-z0-9_]+)\b`)

// SeriesOf returns the series names expr references (for histograms the
// _bucket, _count and _sum series as written).
func SeriesOf(expr string) []string {
	var out []string
	for _, m := range seriesRE.FindAllString(expr, -1) {
		if !slices.Contains(out, m) {
			out = append(out, m)
		}
	}
	return out
}

// Series returns every series the dashboard and the alert rules reference,
// sorted.
func Series() ([]string, error) {
	rules, err := AlertRules()
	if err != nil {
		return nil, err
	}
	panels, err := DashboardPanels()
	if err != nil {
		return nil, err
	}
	var exprs []string
	for _, r := range rules {
		exprs = append(exprs, r.Expr)
	}
	for _, p := range panels {
		exprs = append(exprs, p.Exprs...)
	}
	var out []string
	for _, e := range exprs {
		for _, s := range SeriesOf(e) {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}
