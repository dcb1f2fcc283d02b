"""The throttle of the Udacity env: a PI speed controller (:class:`ThrottleController`); the policy only steers."""

from __future__ import annotations


class ThrottleController:
    """A PI speed controller: the throttle command that holds the car at ``target_speed`` mph.

    With the error ``e = target_speed - speed`` (mph) the command is
    ``kp * e + ki * integral(e dt)`` (dt in seconds), clamped to ``[0, max_throttle]`` while the
    car is at most ``brake_margin`` mph above the target (it coasts; a negative throttle at low
    speed would make the simulator reverse) and to ``[-max_brake, max_throttle]`` above that
    (negative throttle is the simulator's foot brake). Anti-windup: the integral only grows
    while the command is not saturated, and stays within ``+-integral_limit`` mph*s.

    Udacity's own ``drive.py`` uses a PI controller too (kp 0.1, ki 0.002 per frame, 9 mph).
    """

    def __init__(self, target_speed: float = 15.0, kp: float = 0.1, ki: float = 0.05,
                 max_throttle: float = 1.0, max_brake: float = 1.0, brake_margin: float = 3.0,
                 integral_limit: float = 20.0):
        if target_speed < 0 or kp < 0 or ki < 0 or brake_margin < 0:
            raise ValueError("target_speed, kp, ki and brake_margin must be >= 0")
        if not (0 < max_throttle <= 1 and 0 <= max_brake <= 1):
            raise ValueError("max_throttle must be in (0, 1] and max_brake in [0, 1]")
        self.target_speed = float(target_speed)
        self.kp, self.ki = float(kp), float(ki)
        self.max_throttle, self.max_brake = float(max_throttle), float(max_brake)
        self.brake_margin = float(brake_margin)
        self.integral_limit = float(integral_limit)
        self.integral = 0.0

    def reset(self) -> None:
        """Forget the accumulated error (call at the start of an episode)."""
        self.integral = 0.0

    def __call__(self, speed_mph: float, dt_s: float = 0.05) -> float:
        """The throttle command (-1..1) for the measured speed (mph), ``dt_s`` seconds after the last call."""
        speed = float(speed_mph)
        error = self.target_speed - speed
        low = -self.max_brake if speed > self.target_speed + self.brake_margin else 0.0
        integral = self.integral + error * max(float(dt_s), 0.0)
        command = self.kp * error + self.ki * integral
        winding_up = (command > self.max_throttle and error > 0) or (command < low and error < 0)
        if not winding_up:  # conditional integration (anti-windup)
            self.integral = min(max(integral, -self.integral_limit), self.integral_limit)
        command = self.kp * error + self.ki * self.integral
        return float(min(max(command, low), self.max_throttle))


__all__ = ["ThrottleController"]
