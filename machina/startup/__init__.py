"""The start-up path of a command, in order: ``preflight`` (the command line, before Hydra makes a folder, on the
search path ``search_path`` says Hydra will use), ``resolvers`` (derived settings at composition), ``validation``
(the composed config), ``system`` (process-wide torch settings) and ``build`` (the parts, the only caller of
``instantiate``)."""
