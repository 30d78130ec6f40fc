"""What the device and the host both speak: MQTT topics, chunk frames, deployment signing and
the OTA state names.

Host code (fleet tools, CLI, converters) and the device agent import these modules; nothing
here imports ``edgesdk.agent``. The package imports none of its modules eagerly: ``chunks`` and
``signing`` build on ``edgesdk.schemas.messages``, which itself takes the state names from
``ota``, so an eager import here would be a cycle.
"""
