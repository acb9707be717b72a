// Package webui is the coordinators' read-only web view, served at /ui/ on
// each member's HTTP listener: the cluster's members, leader and term; the
// brokers with their state, epoch, lease, each coordinator's observation
// and why a suspect broker is not failed over yet; the recovery jobs with
// progress, rate and ETA; every failover as an SVG timeline of its phases;
// and the event log with filters. The page polls a small JSON API under
// /ui/api/ once a second.
//
// It owns the HTTP handler, the JSON API, the SVG rendering of timelines
// (package timeline derives them) and the page's assets, embedded in the
// binary (embed.FS): no build step, nothing loaded from elsewhere.
//
// It must never change anything (it answers GET and HEAD only, and its
// Source has no method that writes), serve a request its Authorize hook
// refused, or import the server: the server implements Source.
package webui
