package version

import (
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Stamped at build time by the Makefile:
//
//	-ldflags "-X walden/version.version=v0.3.0 -X walden/version.commit=1a2b3c4"
//
// Empty when the binary was built without them.
var (
	version string
	commit  string
)

// Unknown is the value of a field the binary does not carry.
const Unknown = "unknown"

// Info describes the running binary.
type Info struct {
	// Version is the release (git describe), e.g. "v0.3.0" or
	// "v0.3.0-4-g1a2b3c4-dirty"; "devel" for a build from a work tree
	// without a stamp.
	Version string `json:"version"`
	// Commit is the full git commit the binary was built from, with
	// "-dirty" when the work tree had local changes; "unknown" when the
	// build recorded none.
	Commit string `json:"commit"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"go_version"`
}

// Get returns the stamped values, completed from the build information the
// Go toolchain recorded.
func Get() Info {
	return get(version, commit, debug.ReadBuildInfo)
}

func get(stampedVersion, stampedCommit string, read func() (*debug.BuildInfo, bool)) Info {
	info := Info{Version: stampedVersion, Commit: stampedCommit, GoVersion: runtime.Version()}
	bi, ok := read()
	if ok {
		if bi.GoVersion != "" {
			info.GoVersion = bi.GoVersion
		}
		if info.Version == "" {
			// "(devel)" for a build inside the module's work tree; a module
			// version (v0.3.0 or a pseudo-version) for `go install m@v`.
			if v := bi.Main.Version; v != "" && v != "(devel)" {
				info.Version = v
			}
		}
		if info.Commit == "" {
			info.Commit = vcsCommit(bi.Settings)
		}
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	if info.Commit == "" {
		info.Commit = Unknown
	}
	return info
}

// vcsCommit is the vcs.revision setting, with "-dirty" when vcs.modified.
func vcsCommit(settings []debug.BuildSetting) string {
	var rev string
	var modified bool
	for _, s := range settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev != "" && modified {
		rev += "-dirty"
	}
	return rev
}

// String is the one-line form: "v0.3.0 (commit 1a2b3c4d5e6f, go1.26.8)",
// with the commit shortened to 12 digits.
func (i Info) String() string {
	c, dirty := strings.CutSuffix(i.Commit, "-dirty")
	if len(c) > 12 {
		c = c[:12]
	}
	if dirty {
		c += "-dirty"
	}
	return i.Version + " (commit " + c + ", " + i.GoVersion + ")"
}

// NewCollector returns the walden_build_info gauge: always 1, with the
// version, commit and Go version as labels (one series per process), so
// that a query can join it onto any other series or count the versions a
// cluster runs during an upgrade.
func NewCollector() prometheus.Collector {
	i := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "walden_build_info",
		Help:        "Build of the running walden binary: always 1, with the version, commit and Go version as labels.",
		ConstLabels: prometheus.Labels{"version": i.Version, "commit": i.Commit, "go_version": i.GoVersion},
	})
	g.Set(1)
	return g
}
