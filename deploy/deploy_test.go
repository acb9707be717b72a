package deploy_test

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"walden/config"
	"walden/deploy"
)

// walden is the walden binary built by TestMain, static as the image builds
// it (CGO_ENABLED=0).
var walden string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "walden-deploy-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	walden = filepath.Join(dir, "walden")
	cmd := exec.Command("go", "build", "-trimpath", "-o", walden, "walden/cmd/walden")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build walden: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// yamlDocs decodes every document of a YAML file.
func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
	var docs []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		docs = append(docs, d)
	}
}

func TestYAMLAndJSONParse(t *testing.T) {
	n := 0
	err := filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		switch filepath.Ext(p) {
		case ".yaml", ".yml":
			if len(yamlDocs(t, p)) == 0 {
				t.Errorf("%s: no document", p)
			}
			n++
		case ".json":
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if !json.Valid(b) {
				t.Errorf("%s: not JSON", p)
			}
			n++
		}
		return nil
	})
	if err != nil || n < 7 {
		t.Fatalf("checked %d files: %v", n, err)
	}
}

// TestExampleConfigsValidate: the example files and every configuration
// inside the Kubernetes ConfigMaps are valid walden configurations.
func TestExampleConfigsValidate(t *testing.T) {
	if _, err := config.LoadServer("config/server.yaml"); err != nil {
		t.Error(err)
	}
	if _, err := config.LoadAgent("config/agent.yaml"); err != nil {
		t.Error(err)
	}
	checked := 0
	for _, f := range []string{"kubernetes/coordinators.yaml", "kubernetes/broker-with-agent.yaml"} {
		for _, d := range yamlDocs(t, f) {
			if d["kind"] != "ConfigMap" {
				continue
			}
			data, _ := d["data"].(map[string]any)
			for name, v := range data {
				text, _ := v.(string)
				var err error
				if strings.Contains(text, "broker_id:") {
					_, err = config.ParseAgent(f+": "+name, []byte(text))
				} else {
					_, err = config.ParseServer(f+": "+name, []byte(text))
				}
				if err != nil {
					t.Error(err)
				}
				checked++
			}
		}
	}
	if checked != 5 {
		t.Fatalf("checked %d configurations in ConfigMaps, want 5 (3 coordinators, 2 agents)", checked)
	}
}

// commandLines gathers every walden command line the deployment files run:
// the Kubernetes containers of the walden image, the units' ExecStart and
// the image's ENTRYPOINT and CMD. $(POD_NAME) becomes the first pod's name.
func commandLines(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, f := range []string{"kubernetes/coordinators.yaml", "kubernetes/broker-with-agent.yaml"} {
		for _, d := range yamlDocs(t, f) {
			if d["kind"] != "StatefulSet" {
				continue
			}
			name := d["metadata"].(map[string]any)["name"].(string)
			spec := d["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
			for _, c := range spec["containers"].([]any) {
				c := c.(map[string]any)
				if !strings.HasPrefix(c["image"].(string), "walden:") {
					continue
				}
				var argv []string
				for _, k := range []string{"command", "args"} {
					for _, a := range asList(c[k]) {
						argv = append(argv, strings.ReplaceAll(a, "$(POD_NAME)", name+"-0"))
					}
				}
				out[f+": "+c["name"].(string)] = argv
			}
		}
	}
	units, _ := filepath.Glob("systemd/*.service")
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "ExecStart="); ok {
				out[u] = strings.Fields(v)
			}
		}
	}
	df, err := os.ReadFile("docker/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var argv []string
	for _, instr := range []string{"ENTRYPOINT", "CMD"} {
		m := regexp.MustCompile(`(?m)^`+instr+` (\[.*\])$`).FindAllSubmatch(df, -1)
		if len(m) == 0 {
			t.Fatalf("Dockerfile: no %s [...]", instr)
		}
		var words []string
		if err := json.Unmarshal(m[len(m)-1][1], &words); err != nil {
			t.Fatalf("Dockerfile %s: %v", instr, err)
		}
		argv = append(argv, words...)
	}
	out["docker/Dockerfile"] = argv
	return out
}

func asList(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// TestCommandsAndFlagsExist: every command line runs walden with a
// subcommand and flags the binary has, and names a file the deployment
// provides where it can tell.
func TestCommandsAndFlagsExist(t *testing.T) {
	lines := commandLines(t)
	if len(lines) != 5 {
		t.Fatalf("found %d command lines, want 5: %v", len(lines), lines)
	}
	for where, argv := range lines {
		if len(argv) < 2 || filepath.Base(argv[0]) != "walden" {
			t.Errorf("%s: %q does not run walden", where, argv)
			continue
		}
		var sub, flags []string
		for _, a := range argv[1:] {
			switch {
			case strings.HasPrefix(a, "--"):
				name, _, _ := strings.Cut(a, "=")
				flags = append(flags, name)
			case len(flags) == 0:
				sub = append(sub, a)
			}
		}
		help, err := exec.Command(walden, append(slices.Clone(sub), "--help")...).CombinedOutput()
		if err != nil {
			t.Errorf("%s: walden %s --help: %v\n%s", where, strings.Join(sub, " "), err, help)
			continue
		}
		if !strings.Contains(string(help), "walden "+strings.Join(sub, " ")) {
			t.Errorf("%s: %q is not a walden command:\n%s", where, strings.Join(sub, " "), help)
		}
		for _, f := range flags {
			if !regexp.MustCompile(`(?m)^\s+(-\w, )?` + regexp.QuoteMeta(f) + `\b`).Match(help) {
				t.Errorf("%s: walden %s has no flag %s", where, strings.Join(sub, " "), f)
			}
		}
	}
}

// TestProbesUseThePlainMetricsListener: the coordinators' probes ask the
// container port that listen.metrics serves, /healthz for liveness and
// startup, /readyz for readiness.
func TestProbesUseThePlainMetricsListener(t *testing.T) {
	var metricsPort int
	for _, d := range yamlDocs(t, "kubernetes/coordinators.yaml") {
		switch d["kind"] {
		case "ConfigMap":
			for name, v := range d["data"].(map[string]any) {
				cfg, err := config.ParseServer(name, []byte(v.(string)))
				if err != nil {
					t.Fatal(err)
				}
				var port int
				if _, err := fmt.Sscanf(cfg.Listen.Metrics[strings.LastIndexByte(cfg.Listen.Metrics, ':')+1:], "%d", &port); err != nil || (metricsPort != 0 && port != metricsPort) {
					t.Fatalf("%s: listen.metrics %q", name, cfg.Listen.Metrics)
				}
				metricsPort = port
			}
		case "StatefulSet":
			c := d["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
			ports := map[string]int{}
			for _, p := range c["ports"].([]any) {
				p := p.(map[string]any)
				ports[p["name"].(string)] = p["containerPort"].(int)
			}
			for probe, path := range map[string]string{"startupProbe": "/healthz", "livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
				pr, ok := c[probe].(map[string]any)
				if !ok {
					t.Errorf("no %s", probe)
					continue
				}
				get := pr["httpGet"].(map[string]any)
				if get["path"] != path || ports[fmt.Sprint(get["port"])] != metricsPort || metricsPort == 0 {
					t.Errorf("%s asks %v on port %v (%d), want %s on listen.metrics (%d)", probe, get["path"], get["port"], ports[fmt.Sprint(get["port"])], path, metricsPort)
				}
			}
			if d["spec"].(map[string]any)["podManagementPolicy"] != "Parallel" || d["spec"].(map[string]any)["replicas"] != 3 {
				t.Errorf("the StatefulSet must start 3 members in parallel (one alone is never ready)")
			}
		}
	}
}

func TestKubernetesObjects(t *testing.T) {
	kinds := map[string]int{}
	for _, d := range yamlDocs(t, "kubernetes/coordinators.yaml") {
		kinds[fmt.Sprint(d["kind"])]++
		if d["kind"] == "Service" && d["spec"].(map[string]any)["clusterIP"] == "None" && d["spec"].(map[string]any)["publishNotReadyAddresses"] != true {
			t.Error("the headless service must publish not-ready addresses: members find each other before a quorum makes them ready")
		}
		if d["kind"] == "PodDisruptionBudget" && d["spec"].(map[string]any)["maxUnavailable"] != 1 {
			t.Error("the PodDisruptionBudget must allow one member down at most")
		}
	}
	if kinds["StatefulSet"] != 1 || kinds["Service"] != 2 || kinds["PodDisruptionBudget"] != 1 || kinds["ConfigMap"] != 1 {
		t.Fatalf("objects %v", kinds)
	}
}

// TestSystemdUnits: the units are valid for systemd (systemd-analyze
// verify, when present, with ExecStart pointed at the built binary) and
// sandboxed.
func TestSystemdUnits(t *testing.T) {
	units, _ := filepath.Glob("systemd/*.service")
	if len(units) != 2 {
		t.Fatalf("units %v", units)
	}
	analyze, _ := exec.LookPath("systemd-analyze")
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes", "CapabilityBoundingSet=\n",
			"RestrictNamespaces=yes", "SystemCallFilter=@system-service", "MemoryDenyWriteExecute=yes"} {
			if !bytes.Contains(b, []byte(want)) {
				t.Errorf("%s: no %q", u, strings.TrimSpace(want))
			}
		}
		if m := regexp.MustCompile(`(?m)^User=(\S+)$`).FindSubmatch(b); m == nil || string(m[1]) == "root" {
			t.Errorf("%s: must run as a user of its own", u)
		}
		if analyze == "" {
			continue
		}
		tmp := filepath.Join(t.TempDir(), filepath.Base(u))
		if err := os.WriteFile(tmp, bytes.ReplaceAll(b, []byte("/usr/local/bin/walden"), []byte(walden)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", tmp).CombinedOutput()
		if err != nil || len(bytes.TrimSpace(out)) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", u, err, out)
		}
	}
	if analyze == "" {
		t.Log("systemd-analyze is not installed: the units were not verified by systemd")
	}
}

// TestImageBinaryIsStatic: the image's build (CGO_ENABLED=0) gives a
// binary that needs no dynamic loader, so that distroless/static runs it.
// The image itself is not built here (no container engine in the tests).
func TestImageBinaryIsStatic(t *testing.T) {
	f, err := elf.Open(walden)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the binary built with CGO_ENABLED=0 needs a dynamic loader")
		}
	}
	df, err := os.ReadFile("docker/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CGO_ENABLED=0", "FROM gcr.io/distroless/static", "USER 65532:65532", "-X walden/version.version="} {
		if !bytes.Contains(df, []byte(want)) {
			t.Errorf("Dockerfile: no %q", want)
		}
	}
	if n := bytes.Count(df, []byte("\nFROM ")); n != 2 {
		t.Errorf("Dockerfile: %d stages, want a build stage and the final one", n)
	}
}

// TestAlertRules: every rule is complete and links a section of the
// runbook that exists.
func TestAlertRules(t *testing.T) {
	rules, err := deploy.AlertRules()
	if err != nil {
		t.Fatal(err)
	}
	runbook, err := os.ReadFile("../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, r := range rules {
		switch {
		case r.Alert == "" || r.Expr == "" || r.For == "":
			t.Errorf("rule %+v: alert, expr and for are required", r)
		case names[r.Alert]:
			t.Errorf("%s twice", r.Alert)
		case !slices.Contains([]string{"critical", "warning", "info"}, r.Labels["severity"]):
			t.Errorf("%s: severity %q", r.Alert, r.Labels["severity"])
		case r.Annotations["summary"] == "" || r.Annotations["description"] == "":
			t.Errorf("%s: summary and description are required", r.Alert)
		case r.Annotations["runbook_url"] != "docs/runbook.md#"+strings.ToLower(r.Alert):
			t.Errorf("%s: runbook_url %q", r.Alert, r.Annotations["runbook_url"])
		case !bytes.Contains(runbook, []byte("\n### "+r.Alert+"\n")):
			t.Errorf("%s: docs/runbook.md has no section ### %s", r.Alert, r.Alert)
		case len(deploy.SeriesOf(r.Expr)) == 0:
			t.Errorf("%s: its expression references no walden series", r.Alert)
		}
		names[r.Alert] = true
	}
	// The conditions the operations guide promises an alert for.
	for _, want := range []string{"WaldenNoLeader", "WaldenQuorumLost", "WaldenRecoveryJobStuck", "WaldenBrokerFailed", "WaldenConfigDrift"} {
		if !names[want] {
			t.Errorf("no alert %s", want)
		}
	}
}

func TestDashboard(t *testing.T) {
	panels, err := deploy.DashboardPanels()
	if err != nil {
		t.Fatal(err)
	}
	if len(panels) < 15 {
		t.Fatalf("%d panels", len(panels))
	}
	for _, p := range panels {
		if len(p.Exprs) == 0 {
			t.Errorf("panel %q queries nothing", p.Title)
		}
		for _, e := range p.Exprs {
			if len(deploy.SeriesOf(e)) == 0 {
				t.Errorf("panel %q: %q references no walden series", p.Title, e)
			}
		}
	}
	series, err := deploy.Series()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d series referenced: %s", len(series), strings.Join(series, " "))
}

// TestCoordinatorMemoryFitsARecovery: the coordinators' GOMEMLIMIT leaves
// room for the recovery's memory bound of every member's configuration
// (plus the member's own state) and stays below the container's memory
// limit, so that a large failover is not OOM-killed.
func TestCoordinatorMemoryFitsARecovery(t *testing.T) {
	const memberState = 128 << 20 // catalog, raft log cache, gRPC, stacks
	var bound int64
	var limit, goLimit int64
	for _, d := range yamlDocs(t, "kubernetes/coordinators.yaml") {
		switch d["kind"] {
		case "ConfigMap":
			for name, v := range d["data"].(map[string]any) {
				cfg, err := config.ParseServer(name, []byte(v.(string)))
				if err != nil {
					t.Fatal(err)
				}
				bound = max(bound, cfg.Recovery.MemoryBound())
			}
		case "StatefulSet":
			c := d["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
			limit = k8sBytes(t, fmt.Sprint(c["resources"].(map[string]any)["limits"].(map[string]any)["memory"]))
			for _, e := range c["env"].([]any) {
				if e := e.(map[string]any); e["name"] == "GOMEMLIMIT" {
					goLimit = k8sBytes(t, strings.TrimSuffix(fmt.Sprint(e["value"]), "B"))
				}
			}
		}
	}
	if bound == 0 || limit == 0 {
		t.Fatalf("no recovery bound (%d) or memory limit (%d) found", bound, limit)
	}
	if goLimit == 0 {
		t.Fatal("the coordinators set no GOMEMLIMIT: the heap may grow to twice a recovery's live memory, past the limit")
	}
	if goLimit > limit*9/10 {
		t.Errorf("GOMEMLIMIT %d MiB leaves under 10%% of the %d MiB limit for the runtime", goLimit>>20, limit>>20)
	}
	if bound+memberState > goLimit {
		t.Errorf("a recovery needs up to %d MiB (+ %d MiB for the member), above GOMEMLIMIT %d MiB", bound>>20, memberState>>20, goLimit>>20)
	}
}

// k8sBytes parses a Kubernetes quantity in binary units ("1Gi", "800Mi").
func k8sBytes(t *testing.T, q string) int64 {
	t.Helper()
	for suffix, mult := range map[string]int64{"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30} {
		if n, ok := strings.CutSuffix(q, suffix); ok {
			var v int64
			if _, err := fmt.Sscanf(n, "%d", &v); err != nil {
				t.Fatalf("quantity %q: %v", q, err)
			}
			return v * mult
		}
	}
	t.Fatalf("quantity %q: want Ki, Mi or Gi", q)
	return 0
}
