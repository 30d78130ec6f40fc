"""The one-command demo (``edgesdk demo``): the whole edgesdk story on one machine.

:mod:`edgesdk.demo.story` runs the steps, :mod:`edgesdk.demo.processes` owns every process it
starts (and kills them all on the way out), :mod:`edgesdk.demo.collector` samples the agents,
and :mod:`edgesdk.demo.fleet_report` turns the samples into the fleet report (HTML + plots).
"""
