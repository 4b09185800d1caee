"""The webhook configuration: registered and kept (docs/design.md, "Floors").

A part beside the controller and the webhook (it imports neither; the composition root
:mod:`fencedlease.app` wires it), run in the controller's process — or in a webhook process
that registers itself by URL — never in the admission path.

* :mod:`.fencepolicies` — FencePolicies → their webhook entries (pure); :class:`PolicyWatch`,
  the process's one FencePolicy watch, and each policy's ``Ready`` status.
* :mod:`.selfregistration` — local mode: the configuration registered by URL with our own CA,
  and its watchdog.
* :mod:`.guard` — chart mode: the chart's configuration kept from being deleted or loosened.
* :mod:`.loosenings` — pure: when a configuration still fences every write, and the repair.
* :mod:`.wiring` — ``start_registration(...)``, called by the composition root.
"""
