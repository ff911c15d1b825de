"""What a stage or a device group can run on: device classes, stage options, arcs, placements."""
