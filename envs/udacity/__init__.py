"""The Udacity self-driving-car simulator as a gymnasium env: protocol, bridge, env and a wire-level fake simulator."""
