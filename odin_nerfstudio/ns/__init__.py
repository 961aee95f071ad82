"""The thin nerfstudio layer: model, dataparser, datamanager and checkpoint loading."""
