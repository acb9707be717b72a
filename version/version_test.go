package version

import (
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestGetPrefersTheStamp(t *testing.T) {
	read := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{GoVersion: "go1.99.1", Main: debug.Module{Version: "v9.9.9"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "ffff"}}}, true
	}
	got := get("v0.3.0", "1a2b3c4", read)
	want := Info{Version: "v0.3.0", Commit: "1a2b3c4", GoVersion: "go1.99.1"}
	if got != want {
		t.Fatalf("get = %+v, want %+v", got, want)
	}
}

func TestGetFallsBackToBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want Info
	}{
		{"go install", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.3.1"}},
			Info{Version: "v0.3.1", Commit: Unknown, GoVersion: "go1.26.8"}},
		{"work tree, dirty", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}},
			Info{Version: "devel", Commit: "abc123-dirty", GoVersion: "go1.26.8"}},
		{"work tree, clean", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "false"}}},
			Info{Version: "devel", Commit: "abc123", GoVersion: "go1.26.8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := get("", "", func() (*debug.BuildInfo, bool) { return tc.bi, true })
			if got != tc.want {
				t.Fatalf("get = %+v, want %+v", got, tc.want)
			}
		})
	}
	got := get("", "", func() (*debug.BuildInfo, bool) { return nil, false })
	if got.Version != "devel" || got.Commit != Unknown || !strings.HasPrefix(got.GoVersion, "go") {
		t.Fatalf("get without build info = %+v", got)
	}
}

func TestBuildInfoMetric(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector())
	i := Get()
	want := `# HELP walden_build_info Build of the running walden binary: always 1, with the version, commit and Go version as labels.
# TYPE walden_build_info gauge
walden_build_info{commit="` + i.Commit + `",go_version="` + i.GoVersion + `",version="` + i.Version + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "walden_build_info"); err != nil {
		t.Fatal(err)
	}
}

func TestString(t *testing.T) {
	i := Info{Version: "v0.3.0", Commit: "0123456789abcdef0123", GoVersion: "go1.26.8"}
	if got, want := i.String(), "v0.3.0 (commit 0123456789ab, go1.26.8)"; got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
	i.Commit += "-dirty"
	if got, want := i.String(), "v0.3.0 (commit 0123456789ab-dirty, go1.26.8)"; got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
}
