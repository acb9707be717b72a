// Package deploy holds what runs walden outside the repository: the
// container image (docker/), systemd units (systemd/), Kubernetes manifests
// (kubernetes/), example configurations (config/), the Grafana dashboard
// (grafana/) and the Prometheus alert rules (prometheus/).
//
// Its Go code only reads those files for the tests that check them (the
// YAML parses, the configurations validate, the commands and flags exist,
// every series the dashboard and the alerts reference is exported by a live
// cluster). It must never be imported by walden's programs.
package deploy
