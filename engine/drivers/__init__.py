"""Drivers own time: `offline` runs the core event to event as fast as the CPU allows;
`pacer` steps it against the wall clock, waking on `alarm` (a Linux timerfd), and judges
the requests handed to it (`arrivals`) in the order of their instants."""
