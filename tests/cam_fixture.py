"""Grad-CAM of the newest frame after a policy streamed the ones before it, for the dashboard tests."""

import numpy as np
import torch


def newest_frame_cam(policy, frames: np.ndarray) -> np.ndarray:
    """(N, H, W, 3) uint8 frames -> (H, W) Grad-CAM map of the last one, through the project's
    :class:`agent.drive.saliency.SaliencyOverlay`, after ``policy.step`` on the N - 1 before it."""
    from agent.drive.saliency import SaliencyOverlay

    state = None
    with torch.no_grad():
        for f in frames[:-1]:
            _, state = policy.step(torch.as_tensor(f)[None], state)
    y, _ = policy.step(torch.as_tensor(frames[-1])[None], state)
    with SaliencyOverlay(policy, policy.config.action_names) as ov:
        return ov.compute(frames[-1], state, y).cam
