//go:build !race

package gpu

// raceEnabled: the race detector multiplies CPU time, so timing budgets are
// not checked under it.
const raceEnabled = false
