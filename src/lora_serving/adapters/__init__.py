"""The adapters a model serves, as one package (nothing is imported here; name the module):

  catalog   one adapter folder -> Adapter, checked; multi_lora.json -> AdapterCatalog; names
  checks    does an adapter fit the served base model (declared base model, weight shapes)
  sources   where adapters come from (multi_lora.json, root folders) and their snapshots
  fleet     the adapters served at runtime: rescans, load/unload, leases, ids, listing
  control   `adapter_command` requests (list, rescan, load, unload) run against the fleet

Imports point one way: catalog uses checks; sources uses catalog; fleet uses catalog, checks
and sources; control runs commands on a fleet it is handed.
"""
