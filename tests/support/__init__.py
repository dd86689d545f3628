"""What the tests share beyond fixtures (the xdist worker groups); the loopback cluster they launch is the
top-level ``trilm.testing.cluster`` package, which the multi-node drills import too."""
