// Package admission decides when a request may go to its pool's engines.
//
// Each pool (one served model) has a Controller. Admit lets a request
// through at once while some replica can take it without queueing inside
// an engine; otherwise the request waits at the router in the pool's queue
// and goes, late-bound, when capacity frees up. The queue serves priority
// classes strictly, and within a class the shortest expected cost first
// (tokens of prefill plus expected decode) with aging, optional fairness
// between tenants, bounded size and deadline-aware shedding.
//
// The package also owns what the balancer needs to answer the controller's
// one question (Capacity): the saturation rule over a replica's numbers
// (SaturationConfig.Fits), the long-prefill lane cap and length-based lanes
// (LaneConfig), and the per-model token estimator that learns how far the
// router's prompt estimate is from the engine's count (Estimator).
//
// Nothing here starts a goroutine except Controller.Run, and every clock is
// injected.
package admission
