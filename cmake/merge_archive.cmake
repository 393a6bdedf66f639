# Appends the members of archive ADD to archive OUT, with ar's MRI script
# (cmake -DAR=ar -DOUT=libprosody.a -DADD=librdkafka.a -P merge_archive.cmake).
# MRI scripts cannot name every path (one under npm's node_modules/@scope/
# is cut at the '@'), so ar runs in OUT's directory on plain relative names,
# with a copy of ADD there.
get_filename_component(dir ${OUT} DIRECTORY)
get_filename_component(out_name ${OUT} NAME)
get_filename_component(add_name ${ADD} NAME)
file(REMOVE_RECURSE ${dir}/merge_archive.tmp)
file(COPY ${ADD} DESTINATION ${dir}/merge_archive.tmp)
file(WRITE ${dir}/merge_archive.tmp/script.mri
  "open ${out_name}\naddlib merge_archive.tmp/${add_name}\nsave\nend\n")
execute_process(COMMAND ${AR} -M INPUT_FILE ${dir}/merge_archive.tmp/script.mri
  WORKING_DIRECTORY ${dir} RESULT_VARIABLE rc)
file(REMOVE_RECURSE ${dir}/merge_archive.tmp)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "merging ${ADD} into ${OUT} failed")
endif()
