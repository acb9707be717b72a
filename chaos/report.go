package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Report is the outcome of a run: `-o json` prints it as it is.
type Report struct {
	Command   string   `json:"command"`
	Date      string   `json:"date"`
	Policy    string   `json:"policy"`
	Seed      uint64   `json:"seed"`
	Scenarios []Result `json:"scenarios"`
	Passed    int      `json:"passed"`
	Failed    int      `json:"failed"`
}

// NewReport totals results.
func NewReport(command, date, policy string, seed uint64, rs []Result) *Report {
	r := &Report{Command: command, Date: date, Policy: policy, Seed: seed, Scenarios: rs}
	if r.Scenarios == nil {
		r.Scenarios = []Result{}
	}
	for _, s := range rs {
		if s.Verdict == "pass" {
			r.Passed++
		} else {
			r.Failed++
		}
	}
	return r
}

// WriteJSON prints the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func ms(v int64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fs", float64(v)/1000)
}

// WriteTable prints the report for people: one line per scenario, then
// each failed scenario's missed goals and every note.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tACKED\tPRESENT\tLOST\tDUPLICATES\tACKED TWICE\tFALSE FAILOVERS\tSTALE WRITES\tLEASE_INVALID\tHEALTHY LAPSES\tLONGEST WAIT\tFAULT→DECIDED\tFAULT→REOPENED\tLINEARIZABLE\tVERDICT")
	for _, s := range r.Scenarios {
		reopen := ms(s.ReopenMs)
		if s.ReopenGoalMs > 0 {
			reopen += fmt.Sprintf(" (≤%s)", ms(s.ReopenGoalMs))
		}
		decided := ms(s.DecisionMs)
		if s.DecisionGoalMs > 0 {
			decided += fmt.Sprintf(" (≤%s)", ms(s.DecisionGoalMs))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", s.Scenario, s.Acked, s.Present, s.Lost, s.Duplicates,
			s.AckedTwice, s.FalseFailovers, s.StaleWrites, s.LeaseInvalid, s.HealthyLapses, ms(s.MaxWaitMs), decided, reopen, s.Linearizable, s.Verdict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range r.Scenarios {
		if len(s.Missed) == 0 && len(s.Notes) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s (%s, %s):\n", s.Scenario, s.Verdict, s.Dir)
		for _, m := range s.Missed {
			fmt.Fprintf(w, "  missed: %s\n", m)
		}
		for _, n := range s.Notes {
			fmt.Fprintf(w, "  note: %s\n", strings.TrimSpace(n))
		}
	}
	fmt.Fprintf(w, "\n%d passed, %d failed (policy %s, seed %d)\n", r.Passed, r.Failed, r.Policy, r.Seed)
	return nil
}
