"""The test bed: the two ways one machine stands in for the network between a room's
devices (``splitroom run --real``, ``serve``, the namespace tests). Nothing a device
computes depends on it; the transport uses only the in-process delay line.

- netem.py: one network namespace per device, joined by a bridge, each pair's round trip
  (and jitter) applied to the packets (:class:`runtime.testbed.netem.EmulatedNetwork`), and
  the removal of what a crashed run left (:func:`runtime.testbed.netem.cleanup_stale`);
- netem_helper.py: the delay program each device namespace runs (NFQUEUE), run by path;
- delay.py: a link's one-way delay held in the sending process, for machines without
  namespaces (:class:`runtime.testbed.delay.DelayLine`, used by
  :func:`runtime.transport.emulate_delay`).
"""
