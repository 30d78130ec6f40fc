"""The precision governor: sensors in, precision switches out.

``sensors`` reads temperatures, power source and throttling from whatever the device has;
``machine`` is the state machine (one transition table) that turns readings into steps on
the model's precision ladder; ``runner`` polls the sensors and applies the steps to the
model server.
"""
