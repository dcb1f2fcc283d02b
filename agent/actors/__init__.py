"""Who drives: actors (the student policy, the expert, mixtures, disturbances, a person) stepping
envs one at a time (:mod:`agent.actors.rollout`, :mod:`agent.actors.record`) or in batches
(:mod:`agent.actors.vector`), and loading a policy file into an actor (:mod:`agent.actors.loading`)."""
