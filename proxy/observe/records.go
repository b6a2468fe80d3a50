package observe

import (
	"encoding/json"
	"sync"
)

// Record is one finished request as the router measured it, kept in a
// bounded ring for `gpurouter bench`, which matches records to its own
// requests by request id to compare client and router latency per request.
// Times are Unix nanoseconds (0 = did not happen); durations are seconds.
//
// Its JSON is a contract with bench.RouterRecord, which restates it so that
// bench can read remote routers without importing the router; bench's
// router_schema_test.go fails when the two disagree. Change a field here,
// then there.
type Record struct {
	RequestID        string  `json:"request_id"`
	Model            string  `json:"model"`
	Replica          string  `json:"replica"`
	Status           int     `json:"status"`
	Outcome          string  `json:"outcome"`
	Stream           bool    `json:"stream"`
	Attempts         int     `json:"attempts"`
	ReceivedNs       int64   `json:"received_unix_ns"`
	AdmittedNs       int64   `json:"admitted_unix_ns"`
	FirstByteNs      int64   `json:"first_byte_unix_ns"`
	FirstTokenNs     int64   `json:"first_token_unix_ns"`
	DoneNs           int64   `json:"done_unix_ns"`
	QueueS           float64 `json:"queue_s"`
	TTFTS            float64 `json:"ttft_s"`
	E2ES             float64 `json:"e2e_s"`
	ITLMeanS         float64 `json:"itl_mean_s"`
	ITLMaxS          float64 `json:"itl_max_s"`
	ITLCount         int     `json:"itl_count"`
	PromptTokens     int     `json:"prompt_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	// EstPromptTokens is the router's own prompt estimate, made before the
	// engine answered (the request's cost: bytes/4 corrected by the pool's
	// learned ratio under admission), so the estimator's error can be read
	// against PromptTokens.
	EstPromptTokens int `json:"est_prompt_tokens"`
	// PredictedTTFTS is the TTFT the replica's latency predictor expected
	// when the request was sent to it, and PlacedTTFTS the TTFT measured
	// over the same span (sent to the replica → first token, without the
	// router's queue): the predictor's error, request by request. 0 when
	// unknown.
	PredictedTTFTS float64 `json:"predicted_ttft_s,omitempty"`
	PlacedTTFTS    float64 `json:"placed_ttft_s,omitempty"`
	// Migrations is how many times the stream moved to another replica
	// after its own failed (outcome "migrated"); ReplicaChain is the
	// replicas it ran on, in order ("r0>r1"; "" when it never moved);
	// MigrationStallS is the longest pause its client saw at a switch.
	Migrations      int     `json:"migrations"`
	ReplicaChain    string  `json:"replica_chain"`
	MigrationStallS float64 `json:"migration_stall_s"`
}

// Records keeps the most recent records; older ones are overwritten.
type Records struct {
	mu   sync.Mutex // guards buf, next, full
	buf  []Record
	next int
	full bool
}

func NewRecords(n int) *Records { return &Records{buf: make([]Record, n)} }

func (r *Records) Add(rec Record) {
	r.mu.Lock()
	r.buf[r.next] = rec
	r.next++
	if r.next == len(r.buf) {
		r.next, r.full = 0, true
	}
	r.mu.Unlock()
}

// Since returns records finished at or after sinceNs, oldest first, at most
// limit of them (the newest ones when more match).
func (r *Records) Since(sinceNs int64, limit int) []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Record
	n := r.next
	start := 0
	if r.full {
		n = len(r.buf)
		start = r.next
	}
	for i := 0; i < n; i++ {
		rec := r.buf[(start+i)%len(r.buf)]
		if rec.DoneNs >= sinceNs {
			out = append(out, rec)
		}
	}
	if limit > 0 && len(out) > limit {
		out = out[len(out)-limit:]
	}
	return out
}

// RecordsJSON is the /debug/requests document.
func RecordsJSON(recs []Record) ([]byte, error) {
	if recs == nil {
		recs = []Record{}
	}
	return json.Marshal(struct {
		Records []Record `json:"records"`
	}{recs})
}
