package server

import (
	"context"
	"reflect"
	"strings"
	"time"

	"walden/authz"
	"walden/config"
	"walden/mtls"
	waldenv1 "walden/proto/walden/v1"
)

// handOffLeadership, on the leader, hands leadership to the most caught-up
// reachable voter before the member stops, so that a planned stop (SIGTERM,
// a rolling upgrade) costs the cluster no election timeout. It waits at
// most a few election timeouts; when no voter can take over, the member
// stops anyway and the others elect a leader as after a crash.
func (s *Server) handOffLeadership() {
	st := s.node.Status()
	if st.LeaderID == "" || st.LeaderID != st.NodeID {
		return
	}
	target, match := "", uint64(0)
	for _, m := range st.Members {
		if m.GetId() == st.NodeID || m.GetMemberRole() == waldenv1.MemberRole_MEMBER_ROLE_LEARNER || !m.GetReachable() {
			continue
		}
		if target == "" || m.GetMatchIndex() > match {
			target, match = m.GetId(), m.GetMatchIndex()
		}
	}
	if target == "" {
		if len(st.Members) > 1 {
			s.logger.Warn("stopping the leader: no reachable voter to hand leadership to; the others elect one after the election timeout", "term", st.Term)
		}
		return
	}
	election := time.Duration(s.cfg.Raft.ElectionTicks) * s.cfg.Raft.TickInterval
	ctx, cancel := context.WithTimeout(context.Background(), 3*election)
	defer cancel()
	start := time.Now()
	if err := s.node.TransferLeadership(ctx, target); err != nil {
		s.logger.Warn("stopping the leader: handing leadership over failed; the others elect one after the election timeout",
			"target_id", target, "term", st.Term, "err", err)
		return
	}
	s.logger.Info("leadership handed over before stopping", "leader_id", target, "term", s.node.Status().Term,
		"match_index", match, "took_ms", time.Since(start).Milliseconds())
}

// ReloadResult says what a Reload applied.
type ReloadResult struct {
	// TLSReloaded is set when the certificate, key and CA files were read
	// again (TLS on).
	TLSReloaded bool
	// NeedRestart lists the top-level keys whose new values take effect
	// only at the next start.
	NeedRestart []string
	// PolicyChanged is set when the policy section changed: it never takes
	// effect in a running cluster (it only seeds a new one; waldenctl
	// policy set changes the cluster's).
	PolicyChanged bool
}

// Reload applies what can change while the member runs from cfg, the
// configuration file read again (SIGHUP): the tls files are read again and
// serve every new connection (certificate rotation). The log level is the
// caller's (it owns the logger). Other changed keys are reported in
// NeedRestart. On an error (unusable files, or a certificate that is not
// this member's own: its peers would refuse its raft frames) nothing
// changes.
func (s *Server) Reload(cfg *config.Server) (ReloadResult, error) {
	var res ReloadResult
	if err := mtls.CheckIdentity(cfg.TLS, authz.Identity{Name: s.cfg.NodeID, Role: authz.RoleCoordinator}); err != nil {
		return res, err
	}
	if err := s.tls.reload(cfg.TLS); err != nil {
		return res, err
	}
	res.TLSReloaded = s.tls.Enabled()
	res.NeedRestart, res.PolicyChanged = changedKeys(s.cfg, cfg)
	return res, nil
}

// changedKeys splits the keys that differ between the running
// configuration and a new one into those that take effect at the next
// start and the policy section, which never does in a running cluster (the
// file only seeds a new one).
func changedKeys(running, next *config.Server) (needRestart []string, policyChanged bool) {
	for _, k := range restartKeys(running, next) {
		if k == "policy" {
			policyChanged = true
			continue
		}
		needRestart = append(needRestart, k)
	}
	return needRestart, policyChanged
}

// restartKeys lists the top-level keys (yaml names) that differ between the
// running configuration and a new one, apart from those applied at run
// time (log.level, tls).
func restartKeys(running, next *config.Server) []string {
	a, b := reflect.ValueOf(*running), reflect.ValueOf(*next)
	t := a.Type()
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" || name == "tls" {
			continue
		}
		av, bv := a.Field(i).Interface(), b.Field(i).Interface()
		if name == "log" {
			al, bl := av.(config.Log), bv.(config.Log)
			if al.Format != bl.Format {
				keys = append(keys, "log.format")
			}
			continue
		}
		if !reflect.DeepEqual(av, bv) {
			keys = append(keys, name)
		}
	}
	return keys
}
