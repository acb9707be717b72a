package webui

import (
	"bytes"
	"fmt"
	"html"

	waldenv1 "walden/proto/walden/v1"
	"walden/timeline"
)

// Layout of a timeline picture, in SVG user units.
const (
	svgWidth   = 960
	svgLabelW  = 190
	svgValueW  = 90
	svgRowH    = 24
	svgAxisH   = 28
	svgBarH    = 14
	svgPadding = 8
)

// phaseColors are the bars' colors by phase kind.
var phaseColors = map[string]string{
	timeline.KindObserve:   "#d9a400",
	timeline.KindDecide:    "#c0392b",
	timeline.KindFence:     "#8e44ad",
	timeline.KindLeaseWait: "#b39ddb",
	timeline.KindAttach:    "#2980b9",
	timeline.KindRead:      "#3498db",
	timeline.KindUpload:    "#16a085",
	timeline.KindCommit:    "#27ae60",
	timeline.KindClose:     "#2c3e50",
	timeline.KindDetach:    "#7f8c8d",
	timeline.KindReopen:    "#e67e22",
}

// niceSteps are the axis tick intervals to choose from, in milliseconds.
var niceSteps = []int64{10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000, 1_800_000, 3_600_000}

// SVG draws failover f as a timeline: one row per phase, a bar from its
// start to its end (to nowUnixMs, hatched, while it goes on), its duration,
// and an axis in seconds from the first observation. Every element carries
// data-kind, data-actor and data-ms attributes, and a <title> with the
// phase's detail.
func SVG(f *waldenv1.Failover, nowUnixMs int64) []byte {
	start, end := timeline.Span(f, nowUnixMs)
	span := max(end-start, 1)
	step := niceSteps[len(niceSteps)-1]
	for _, s := range niceSteps {
		if span/s <= 8 {
			step = s
			break
		}
	}
	// Round the span up to whole ticks, so that the last tick is the edge.
	span = max((span+step-1)/step*step, step)
	plotW := float64(svgWidth - svgLabelW - svgValueW - 2*svgPadding)
	x := func(ms int64) float64 {
		return svgLabelW + svgPadding + float64(ms-start)/float64(span)*plotW
	}
	phases := f.GetPhases()
	height := svgAxisH + len(phases)*svgRowH + svgPadding
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="timeline" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s" data-failover="%s" font-family="sans-serif" font-size="12">`,
		svgWidth, height, svgWidth, height, esc("timeline of failover "+f.GetId()), esc(f.GetId()))
	b.WriteString(`<defs><pattern id="running" width="8" height="8" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="4" height="8" fill="#ffffff" fill-opacity="0.45"/></pattern></defs>`)
	// Axis: a tick per step, labelled in seconds from the start.
	for t := int64(0); t <= span; t += step {
		xx := x(start + t)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#dddddd"/>`, xx, svgAxisH-6, xx, height-svgPadding)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555555">%s</text>`, xx, svgAxisH-10, esc(axisLabel(t, step)))
	}
	for i, p := range phases {
		y := svgAxisH + i*svgRowH
		d := timeline.Duration(p, nowUnixMs)
		running := p.GetEndUnixMs() == 0
		label := timeline.Label(p.GetKind())
		if p.GetActor() != "" {
			label += " · " + p.GetActor()
		}
		color := phaseColors[p.GetKind()]
		if color == "" {
			color = "#95a5a6"
		}
		fmt.Fprintf(&b, `<g class="phase" data-kind="%s" data-actor="%s" data-ms="%d" data-running="%t">`, esc(p.GetKind()), esc(p.GetActor()), d, running)
		title := fmt.Sprintf("%s: %s", label, durationText(d))
		if running {
			title += " so far"
		}
		if p.GetDetail() != "" {
			title += "\n" + p.GetDetail()
		}
		fmt.Fprintf(&b, `<title>%s</title>`, esc(title))
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#222222">%s</text>`, svgPadding, y+svgBarH, esc(label))
		x0 := x(p.GetStartUnixMs())
		x1 := x(p.GetStartUnixMs() + d)
		w := max(x1-x0, 2)
		if p.GetKind() == timeline.KindDecide {
			// An instant: a diamond.
			cy := float64(y) + svgBarH/2 + 3
			fmt.Fprintf(&b, `<path d="M%.1f %.1f l7 7 l-7 7 l-7 -7 z" fill="%s"/>`, x0, cy-7, color)
		} else {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" rx="2" fill="%s"/>`, x0, y+4, w, svgBarH, color)
			if running {
				fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" rx="2" fill="url(#running)"/>`, x0, y+4, w, svgBarH)
			}
		}
		value := durationText(d)
		if running {
			value += " …"
		}
		if p.GetKind() == timeline.KindDecide {
			value = "at " + axisLabel(p.GetStartUnixMs()-start, 1)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" fill="#222222">%s</text>`, svgWidth-svgPadding, y+svgBarH, esc(value))
		b.WriteString(`</g>`)
	}
	b.WriteString(`</svg>`)
	return b.Bytes()
}

func esc(s string) string { return html.EscapeString(s) }

// axisLabel is an offset from the start: "+1.5s", "+2m".
func axisLabel(ms, step int64) string {
	switch {
	case ms == 0:
		return "0"
	case step >= 60_000 && ms%60_000 == 0:
		return fmt.Sprintf("+%dm", ms/60_000)
	case step >= 1000 && ms%1000 == 0:
		return fmt.Sprintf("+%ds", ms/1000)
	}
	return fmt.Sprintf("+%.2fs", float64(ms)/1000)
}

// durationText shows a duration for people: "840 ms", "2.32 s", "1m4s".
func durationText(ms int64) string {
	switch {
	case ms < 1000:
		return fmt.Sprintf("%d ms", ms)
	case ms < 60_000:
		return fmt.Sprintf("%.2f s", float64(ms)/1000)
	}
	return fmt.Sprintf("%dm%ds", ms/60_000, ms%60_000/1000)
}
