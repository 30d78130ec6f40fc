"""The MQTT link between devices and the fleet.

``client`` is the only module that imports paho-mqtt; everything else (topics, the
store-and-forward queue, the broker launcher for tests) works without it.
"""
