package admission

// Stats is a point-in-time view of a controller, for debug pages.
type Stats struct {
	Model             string
	Queued            int     // requests waiting
	QueuedByClass     []int   // index = class
	QueuedTokens      int64   // their cost
	InFlight          int     // admitted, not released
	OutstandingTokens int64   // their cost
	DrainRate         float64 // learned tokens/s while saturated; 0 = unknown
	PromptCorrection  float64 // learned engine tokens per raw token
	ExpectedOutput    int     // learned expected output without max_tokens
}

// Stats returns the controller's current state.
func (c *Controller) Stats() Stats {
	c.mu.Lock()
	s := Stats{
		Model:             c.model,
		Queued:            c.queued,
		QueuedByClass:     make([]int, len(c.classes)),
		QueuedTokens:      c.queuedTokens,
		InFlight:          c.inFlight,
		OutstandingTokens: c.outstanding,
		DrainRate:         c.drainRate,
	}
	for i := range c.classes {
		s.QueuedByClass[i] = c.classes[i].n
	}
	c.mu.Unlock()
	s.PromptCorrection = c.est.Ratio()
	s.ExpectedOutput = c.est.ExpectedOutput()
	return s
}
