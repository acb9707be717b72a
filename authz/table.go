package authz

import (
	"slices"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"

	waldenv1 "walden/proto/walden/v1"
)

// Rule says who may call one method.
type Rule struct {
	// Roles may call the method.
	Roles []Role
	// BrokerBound makes agent and broker identities act only for their own
	// broker: the request's broker_id field must be their broker id. Other
	// roles are not restricted by it.
	BrokerBound bool
}

// Allows reports whether role may call the method (before the broker id
// check).
func (r Rule) Allows(role Role) bool { return slices.Contains(r.Roles, role) }

// The sets of roles the table is written with.
var (
	admins    = []Role{RoleAdmin}
	operators = []Role{RoleOperator, RoleAdmin}
	readers   = []Role{RoleReader, RoleOperator, RoleAdmin}
	agents    = []Role{RoleAgent, RoleBroker}
	brokers   = []Role{RoleBroker}
	everyone  = Roles
)

func union(sets ...[]Role) []Role {
	var out []Role
	for _, s := range sets {
		for _, r := range s {
			if !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
	}
	return out
}

// table is the authorization of every gRPC method a coordinator serves, by
// full method name. A method missing here is refused to everyone (default
// deny); the server's matrix test fails for a registered method that has
// no entry.
var table = map[string]Rule{
	// walden.v1.Cluster: the raft group.
	waldenv1.Cluster_Status_FullMethodName:         {Roles: readers},
	waldenv1.Cluster_MemberList_FullMethodName:     {Roles: readers},
	waldenv1.Cluster_MemberAdd_FullMethodName:      {Roles: admins},
	waldenv1.Cluster_MemberRemove_FullMethodName:   {Roles: admins},
	waldenv1.Cluster_LeaderTransfer_FullMethodName: {Roles: operators},

	// walden.v1.Agent: a broker's registration and lease.
	waldenv1.Agent_Register_FullMethodName:   {Roles: agents, BrokerBound: true},
	waldenv1.Agent_RenewLease_FullMethodName: {Roles: agents, BrokerBound: true},
	// Every renewal on the stream names its broker and is checked.
	waldenv1.Agent_RenewLeases_FullMethodName: {Roles: agents, BrokerBound: true},

	// walden.v1.Brokers: the registry, the event log and the policy.
	// Brokers look up other brokers' addresses (NOT_OWNER hints).
	waldenv1.Brokers_ListBrokers_FullMethodName:    {Roles: union(readers, brokers)},
	waldenv1.Brokers_GetBroker_FullMethodName:      {Roles: union(readers, brokers)},
	waldenv1.Brokers_Failover_FullMethodName:       {Roles: operators},
	waldenv1.Brokers_Ack_FullMethodName:            {Roles: operators},
	waldenv1.Brokers_SetMaintenance_FullMethodName: {Roles: operators},
	waldenv1.Brokers_ListEvents_FullMethodName:     {Roles: readers},
	waldenv1.Brokers_GetPolicy_FullMethodName:      {Roles: readers},
	waldenv1.Brokers_SetPolicy_FullMethodName:      {Roles: operators},
	waldenv1.Brokers_RemoveBroker_FullMethodName:   {Roles: admins},

	// walden.v1.Catalog: a broker writes its own streams; everyone who
	// reads may read the catalog.
	waldenv1.Catalog_OpenStream_FullMethodName:        {Roles: brokers, BrokerBound: true},
	waldenv1.Catalog_CommitObject_FullMethodName:      {Roles: brokers, BrokerBound: true},
	waldenv1.Catalog_CloseStream_FullMethodName:       {Roles: brokers, BrokerBound: true},
	waldenv1.Catalog_GetOpeningStreams_FullMethodName: {Roles: union(readers, brokers), BrokerBound: true},
	waldenv1.Catalog_ListStreams_FullMethodName:       {Roles: union(readers, brokers)},
	waldenv1.Catalog_DescribeStream_FullMethodName:    {Roles: union(readers, brokers)},

	// walden.v1.Jobs: recovery jobs.
	waldenv1.Jobs_ListJobs_FullMethodName:   {Roles: readers},
	waldenv1.Jobs_GetJob_FullMethodName:     {Roles: readers},
	waldenv1.Jobs_WatchJobs_FullMethodName:  {Roles: readers},
	waldenv1.Jobs_CancelJob_FullMethodName:  {Roles: operators},
	waldenv1.Jobs_RetryJob_FullMethodName:   {Roles: operators},
	waldenv1.Jobs_ResolveJob_FullMethodName: {Roles: operators},

	// walden.v1.Watch: the replicated state's changes (brokers learn that
	// streams closed).
	waldenv1.Watch_Watch_FullMethodName: {Roles: union(readers, brokers)},

	// walden.v1.Failovers: each failover told as phases.
	waldenv1.Failovers_ListFailovers_FullMethodName: {Roles: readers},
	waldenv1.Failovers_GetFailover_FullMethodName:   {Roles: readers},

	// walden.v1.Maintenance: a backup holds the whole state.
	waldenv1.Maintenance_Snapshot_FullMethodName: {Roles: admins},

	// walden.v1.Raft: the peer transport (raft listener).
	waldenv1.Raft_Stream_FullMethodName: {Roles: []Role{RoleCoordinator}},

	// Health answers every identity; reflection serves people's tools.
	healthpb.Health_Check_FullMethodName:                                   {Roles: everyone},
	healthpb.Health_List_FullMethodName:                                    {Roles: everyone},
	healthpb.Health_Watch_FullMethodName:                                   {Roles: everyone},
	reflectionv1.ServerReflection_ServerReflectionInfo_FullMethodName:      {Roles: readers},
	reflectionv1alpha.ServerReflection_ServerReflectionInfo_FullMethodName: {Roles: readers},
}

// Lookup returns the rule of a full method name ("/walden.v1.Brokers/Failover").
func Lookup(method string) (Rule, bool) {
	r, ok := table[method]
	return r, ok
}

// Methods lists the methods the table knows, in no particular order.
func Methods() []string {
	out := make([]string, 0, len(table))
	for m := range table {
		out = append(out, m)
	}
	return out
}
