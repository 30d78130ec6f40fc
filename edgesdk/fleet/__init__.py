"""Fleet-side tools: the live device view over MQTT (monitor) and, later, staged rollouts."""
