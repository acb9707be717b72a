package config_test

import (
	"testing"

	"walden/config"
	"walden/internal/docgen"
)

// TestConfigReferencesUpToDate: the configuration references of
// docs/server.md, docs/agent.md and docs/broker.md are generated from the
// config structs (every key, its default, its doc comment with its limits);
// a key added, removed, re-documented or with another default fails here
// until `make docs` writes them again. Every key has a doc comment.
func TestConfigReferencesUpToDate(t *testing.T) {
	for _, ref := range []struct {
		page, region string
		def          any
	}{
		{"../docs/server.md", "config.Server", config.DefaultServerConfig()},
		{"../docs/agent.md", "config.Agent", config.DefaultAgentConfig()},
		{"../docs/broker.md", "config.Broker", config.DefaultBrokerConfig()},
	} {
		keys, err := docgen.ConfigKeys(ref.def)
		if err != nil {
			t.Fatal(err)
		}
		if missing := docgen.Undocumented(keys); len(missing) > 0 {
			t.Errorf("%s: keys without a doc comment on their field: %v", ref.region, missing)
		}
		err = docgen.Sync(ref.page, func(old string) (string, error) {
			return docgen.ReplaceRegion(old, ref.region, docgen.ConfigTable(keys))
		})
		if err != nil {
			t.Error(err)
		}
	}
}
