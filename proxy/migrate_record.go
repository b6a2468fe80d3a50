package proxy

import (
	"github.com/gpurouter/gpurouter/proxy/observe"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// What the request's record and access log line say of a stream that
// moved: how often, over which replicas, and the longest pause its client
// saw at a switch.

// recordInto fills rec's migration fields; nothing for a stream that never
// moved (or a nil migration).
func (m *migration) recordInto(rec *observe.Record) {
	if m == nil || m.migrations == 0 {
		return
	}
	rec.Migrations = m.migrations
	rec.ReplicaChain = m.chain()
	rec.MigrationStallS = m.stall.Seconds()
}

// logField is the access log's "migration" object; skipped for a stream
// that never moved.
func (m *migration) logField() zap.Field {
	if m == nil || m.migrations == 0 {
		return zap.Skip()
	}
	return zap.Object("migration", m)
}

// MarshalLogObject implements zapcore.ObjectMarshaler.
func (m *migration) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddInt("count", m.migrations)
	enc.AddString("replica_chain", m.chain())
	enc.AddDuration("stall", m.stall)
	enc.AddInt("tokens_before", m.before)
	return nil
}
