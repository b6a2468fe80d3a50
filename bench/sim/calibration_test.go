package sim

import (
	"os"
	"testing"
)

// TestCalibration reproduces every row of shared/calibration.md in virtual
// time and requires the checked ones within ±25%. Run with -v for the table:
//
//	go test ./bench/sim -run Calibration -v
func TestCalibration(t *testing.T) {
	rows, err := Calibrate()
	if err != nil {
		t.Fatal(err)
	}
	if testing.Verbose() {
		WriteCalibrationTable(os.Stdout, rows)
	}
	for _, r := range rows {
		if !r.OK() {
			t.Errorf("row %s %q on %s: target %.4g %s, simulated %.4g (%+.0f%%)", r.Row, r.Metric, r.Profile,
				r.Target, r.Unit, r.Got, 100*r.Deviation())
		}
	}
}
