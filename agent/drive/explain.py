"""The live interpretability of one ``drive`` run (:class:`Overlays`): CAM saliency and the NAC
neuron traces, computed per step, kept as history (and for ``--dump-traces``) and handed to the
drawers of :mod:`agent.drive.overlays`.
"""

from __future__ import annotations

import numpy as np

from agent.actors.rollout import Actor, Decision, PolicyActor
from agent.drive.hud import DEFAULT_ACTION_NAMES, Renderer
from agent.drive.overlays import PanelNote, SaliencyDrawer, TracePanel
from agent.drive.saliency import (DEFAULT_LAYER, DEFAULT_METHOD, PendingSaliency, SaliencyOverlay,
                                  check_saliency_method, resolve_saliency_layer, saliency_unavailable_reason)
from agent.drive.traces import TraceHistory, TraceRecorder, action_number, step_traces


class Overlays:
    """The live interpretability of one run: CAM saliency (HiResCAM by default) and NAC neuron traces.

    Built once per run. Saliency needs a policy with the CNN saliency hooks; traces need NAC
    intermediates from the policy's ``step``. When either is impossible it stays off and
    :attr:`reasons` says why (the runner prints it). Toggles (keys S and T) switch the work off,
    not just the drawing.

    Args:
        policy: the loaded policy (any kind).
        driver: the runner's driver for it.
        renderer: where the drawers go (None: nothing is shown; traces may still be dumped).
        saliency, traces: whether to try each.
        dump: keep every step's traces for ``--dump-traces``, with the step's CAM map (then
            computed also when nothing is drawn, unless ``saliency`` is False).
        recorder: where the dumped steps go when they can be recorded: an object with
            :meth:`agent.drive.traces.TraceRecorder.add`'s method, e.g. a streaming
            :class:`agent.drive.traces.TraceWriter`; None: an in-memory ``TraceRecorder``.
        opacity: initial heat-map opacity (0..1).
        class_names: names of the action classes.
        saliency_method, saliency_layer: the CAM (a key of
            :data:`agent.drive.saliency.SALIENCY_METHODS`) and its convolution (``conv1`` ..,
            ``last``, ``auto``: the first).
        fuse: act through the CAM's forward (the default: one differentiable forward gives the
            action; :meth:`explain` runs the CAM's backward on it, after the runner has sent the
            action, so with the env in a worker process the map is computed while the env steps).
            False: the driver takes a plain no-grad step and :meth:`explain` computes the map with
            a second forward and the backward (about 2.8 ms more CPU per step here; kept to
            compare).
    """

    def __init__(self, policy, driver: Actor, renderer: "Renderer | None", *, saliency: bool, traces: bool,
                 dump: bool = False, opacity: float = 0.5, class_names: tuple[str, ...] = DEFAULT_ACTION_NAMES,
                 fuse: bool = True, recorder=None, saliency_method: str = DEFAULT_METHOD,
                 saliency_layer: str = DEFAULT_LAYER):
        self.reasons: dict[str, str] = {}
        self.saliency = None
        self._fused = False
        self.saliency_drawer = None
        self.history = self.panel = self.recorder = None
        self.class_names = tuple(class_names)
        self.topk = getattr(getattr(policy, "nac", None), "topk", None)
        policy_actor = isinstance(driver, PolicyActor)
        # --dump-traces writes every step (actions, rewards, stall figures, the teacher's labels), the NAC
        # traces when the policy has a NAC core, and each step's Grad-CAM map (``cam``) of a policy that
        # acts on the frame, computed even when nothing is drawn (headless), unless saliency is off
        # (--no-saliency, --no-overlay).
        dumping = dump and policy_actor
        #: the dumped steps carry NAC traces (a NAC core); otherwise they are kept without them
        self.nac_dump = dumping and not driver.traces_reason
        if saliency and policy_actor and saliency_unavailable_reason(policy) is None:
            resolve_saliency_layer(policy, saliency_layer)  # a wrong --saliency-layer fails even when nothing is drawn
            check_saliency_method(saliency_method)
        if saliency and (renderer is not None or dumping):
            reason = saliency_unavailable_reason(policy) if policy_actor else \
                f"{driver.label} acts without a CNN on the frame"
            if reason:
                self.reasons["saliency"] = reason
            else:
                self.saliency = SaliencyOverlay(policy, tuple(getattr(policy.config, "action_names", ())),
                                                method=saliency_method, layer=saliency_layer)
                if renderer is not None:
                    self.saliency_drawer = SaliencyDrawer(opacity)
                    renderer.frame_filters.append(self.saliency_drawer)
                # one forward for the action and Grad-CAM (a policy without saliency_step: two)
                self._fused = fuse and policy_actor and callable(getattr(policy, "saliency_step", None))
        if dump:
            self.recorder = recorder if recorder is not None else TraceRecorder()
        if (traces and renderer is not None) or dump:
            if not policy_actor or driver.traces_reason:
                self.reasons["traces"] = driver.traces_reason
                if traces and renderer is not None and renderer.panel_rect.width:
                    renderer.panels.append(PanelNote(f"NAC traces off: {driver.traces_reason}",
                                                     renderer.panel_rect.width))
            else:
                driver.want_intermediates = True
                if traces and renderer is not None and renderer.panel_rect.width:
                    size = renderer.panel_rect.size
                    self.history = TraceHistory(TracePanel.plot_width_for(size[0]))
                    self.panel = TracePanel(size, self.history, policy.nac.num_heads, policy.config.window,
                                            self.class_names)
                    renderer.panels.append(self.panel)
        self.driver = driver
        self._attach()

    def _attach(self) -> None:
        """Let the driver act through Grad-CAM's forward while the saliency is on (see PolicyActor.saliency)."""
        if self._fused:
            self.driver.saliency = self.saliency if self.saliency_on else None

    # ------------------------------------------------------------------ toggles
    @property
    def saliency_on(self) -> bool:
        """Grad-CAM runs this step: built, and not switched off with the S key (nothing to switch headless)."""
        return self.saliency is not None and (self.saliency_drawer is None or self.saliency_drawer.enabled)

    def toggle_saliency(self) -> None:
        if self.saliency_drawer is not None:
            self.saliency_drawer.enabled = not self.saliency_drawer.enabled
            self._attach()

    def toggle_traces(self) -> None:
        if self.panel is not None:
            self.panel.enabled = not self.panel.enabled

    def next_head(self) -> None:
        if self.panel is not None:
            self.panel.next_head()

    def adjust_opacity(self, delta: float) -> None:
        if self.saliency_drawer is not None:
            self.saliency_drawer.adjust(delta)

    def new_episode(self) -> None:
        if self.history is not None:
            self.history.clear()

    # ------------------------------------------------------------------ per step
    def explain(self, obs: np.ndarray, d: Decision, extras: dict) -> str:
        """Compute this step's overlays into ``extras``; returns the status line for the HUD."""
        status = []
        if self.saliency is not None:
            if self.saliency_on and (d.saliency is not None or d.output is not None):
                if isinstance(d.saliency, PendingSaliency):
                    sal = self.saliency.finish(d.saliency)  # the backward of the forward the driver acted on
                elif d.saliency is not None:
                    sal = d.saliency
                else:
                    sal = self.saliency.compute(obs, d.state_before, d.output, d.t)
                extras["saliency"] = sal
                opacity = f", opacity {self.saliency_drawer.opacity:.1f}" if self.saliency_drawer is not None else ""
                status.append(f"{sal.status()}, {1000 * sal.seconds:.1f} ms{opacity}")
            else:
                self.saliency.discard()  # the hooks saw the policy's own step; keep nothing
                status.append(f"{self.saliency.label} off")
        if d.intermediates is not None:
            cache = getattr(d.state, "cache", None)
            tr = step_traces(d.intermediates, 0, cache.length - 1 if cache is not None else None, self.topk)
            extras["traces"] = tr
            if self.history is not None and self.panel.enabled:
                self.history.push(tr, d.action_class)
        if self.panel is not None and self.driver.traces_reason:
            self.panel.note = f"traces off: {self.driver.traces_reason}"
        return "   ".join(status)

    def record(self, extras: dict, d: Decision, reward: float, episode: int, step: int, time_s: float,
               speed: float = float("nan"), off_road: bool | None = None,
               teacher: tuple[float, int] | None = None) -> None:
        """Keep this step for ``--dump-traces``: with its NAC traces when the policy has a NAC core (a step of
        such a policy that has none is not kept), otherwise without them (another core, the expert).

        Args:
            extras: what :meth:`explain` computed for the step (its traces and Grad-CAM map).
            d: the decision taken; ``reward`` the reward that followed.
            episode, step: 1-based; ``time_s`` the frame time in seconds.
            speed: the car's speed after the step, simulator units per second (NaN if unknown).
            off_road: all four wheels off the road after the step (None for an env without wheels).
            teacher: ``--teacher.expert``'s label of the step's state, (its action as one number: the
                index or the normalised steering, its class), or None.
        """
        if self.recorder is not None and ("traces" in extras or not self.nac_dump):
            sal = extras.get("saliency")
            self.recorder.add(extras.get("traces"), action=action_number(d.action), action_class=d.action_class, reward=reward,
                              episode=episode, step=step, time_s=time_s, speed=speed, off_road=off_road,
                              cam=None if sal is None else sal.cam, teacher=teacher)

    def close(self) -> None:
        """Release Grad-CAM's hooks (and detach the driver from them)."""
        if self._fused:
            self.driver.saliency = None
        if self.saliency is not None:
            self.saliency.close()


__all__ = ["Overlays"]
